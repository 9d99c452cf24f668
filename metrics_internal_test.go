package delaybridge

import "testing"

func TestSkipLabel_KeepsOutboxReasonsAndBoundsTheRest(t *testing.T) {
	for in, want := range map[string]string{"": "", "cancelled": "cancelled", "done": "done", "stale": "stale",
		"missing": "missing", "dead": "dead", "order 42 was paid": "other"} {
		if got := skipLabel(in); got != want {
			t.Errorf("skipLabel(%q) = %q, want %q", in, got, want)
		}
	}
}
