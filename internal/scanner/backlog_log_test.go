package scanner_test

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// The dead-task warning used to be logged on every backlog check (every
// 10 s): 153 identical lines in 27 minutes. It is logged when the count
// rises, once an hour while it stays, and once when it clears.
func TestScanner_BacklogLogsTheDeadCountOnChangeOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.task(t, "dead-1", outbox.StateDead, time.Now())
	b.task(t, "dead-2", outbox.StateDead, time.Now())
	var logs testenv.SyncBuffer
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	s, err := scanner.New(b.db, b.mem, scanner.Config{Grace: time.Second, Now: now,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	const warning = "dead tasks need attention"
	check := func(want int, why string) {
		t.Helper()
		if _, _, err := s.Backlog(b.ctx); err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(logs.String(), warning); got != want {
			t.Fatalf("%s: %d dead-task warnings logged, want %d; log:\n%s", why, got, want, logs.String())
		}
	}
	check(1, "first check of 2 dead")
	for range 5 {
		advance(10 * time.Second)
		check(1, "the same 2 dead again")
	}
	b.task(t, "dead-3", outbox.StateDead, time.Now())
	check(2, "a third dead task")
	advance(30 * time.Minute)
	check(2, "the same 3 dead half an hour later")
	advance(31 * time.Minute)
	check(3, "the same 3 dead over an hour after the last warning")
	if _, err := b.db.Exec("DELETE FROM delay_task WHERE state = 'dead'"); err != nil {
		t.Fatal(err)
	}
	check(3, "no dead task left")
	if got := strings.Count(logs.String(), "no dead task left"); got != 1 {
		t.Fatalf("%d 'no dead task left' lines, want 1; log:\n%s", got, logs.String())
	}
	check(3, "still none")
	if got := strings.Count(logs.String(), "no dead task left"); got != 1 {
		t.Fatalf("%d 'no dead task left' lines after a second empty check, want 1", got)
	}
}
