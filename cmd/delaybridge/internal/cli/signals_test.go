package cli

import (
	"strings"
	"testing"

	"fmt"
	"github.com/delaybridge/delaybridge/internal/ops"
)

// status says a topic's count of unconsumed overdue tasks is a lower bound
// when the check read as many as it reads at most, and only then.
func TestPrintUnconsumed_SaysAtLeastWhenTheScanWasFull(t *testing.T) {
	var below, full strings.Builder
	PrintUnconsumed(&below, map[string]int{"a": 3, "b": ops.UnconsumedScan - 4})
	PrintUnconsumed(&full, map[string]int{"a": 3, "b": ops.UnconsumedScan - 3})
	if strings.Contains(below.String(), "at least") || !strings.Contains(below.String(), "topic a has 3 overdue tasks") {
		t.Errorf("below the scan's limit:\n%s", below.String())
	}
	for _, want := range []string{"topic a has at least 3 overdue", fmt.Sprintf("topic b has at least %d overdue", ops.UnconsumedScan-3), fmt.Sprintf("oldest %d overdue tasks only", ops.UnconsumedScan)} {
		if !strings.Contains(full.String(), want) {
			t.Errorf("at the scan's limit, no %q in:\n%s", want, full.String())
		}
	}
}
