package outbox

import (
	"testing"

	"github.com/delaybridge/delaybridge/internal/store"
)

// The relay and the scanner claim rows through internal/store, which names
// states as plain strings; they must be the values outbox stores.
func TestStates_MatchStore(t *testing.T) {
	for _, c := range []struct {
		outbox State
		store  string
	}{
		{StatePending, store.Pending},
		{StatePublished, store.Published},
		{StateDone, store.Done},
		{StateCancelled, store.Cancelled},
	} {
		if string(c.outbox) != c.store {
			t.Errorf("outbox state %q, store says %q", c.outbox, c.store)
		}
	}
}
