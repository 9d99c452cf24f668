package testutil_test

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testutil"
)

func TestEventually_ReportsTrueOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	calls := 0
	if !testutil.Eventually(10*time.Second, time.Millisecond, func() bool { calls++; return calls == 3 }) {
		t.Fatal("Eventually = false for a condition true on the third call")
	}
	if calls != 3 {
		t.Fatalf("cond called %d times, want 3: it must stop once true", calls)
	}
}

func TestEventually_ReportsFalseAfterTheWaitWithOneLastCall(t *testing.T) {
	t.Parallel()
	start := time.Now()
	var last time.Time
	if testutil.Eventually(30*time.Millisecond, 5*time.Millisecond, func() bool { last = time.Now(); return false }) {
		t.Fatal("Eventually = true for a condition never true")
	}
	if last.Sub(start) < 30*time.Millisecond {
		t.Fatalf("last call %v after the start, want one after the 30ms wait", last.Sub(start))
	}
}
