package outbox

import (
	"testing"
	"time"
)

// The probe looks every Probe while anything happens; once ProbeQuietLooks
// looks in a row found nothing, its wait doubles up to ProbeMax, and the
// first busy look puts it back at Probe.
func TestProbePace_SlowsWhenQuietAndSpeedsUpOnActivity(t *testing.T) {
	p := probePace{fast: 50 * time.Millisecond, slow: 200 * time.Millisecond}
	if w := p.next(false); w != p.fast {
		t.Fatalf("first wait %v, want Probe", w)
	}
	for i := range ProbeQuietLooks {
		if w := p.next(false); w != p.fast {
			t.Fatalf("quiet look %d: wait %v, want Probe until %d quiet looks", i+1, w, ProbeQuietLooks)
		}
	}
	for i, want := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond} {
		if w := p.next(false); w != want {
			t.Fatalf("quiet look %d past the threshold: wait %v, want %v", i+1, w, want)
		}
	}
	if w := p.next(true); w != p.fast {
		t.Fatalf("after a busy look: wait %v, want Probe at once", w)
	}
	// The count starts again: a relay busy a moment ago is not quiet yet.
	for i := range ProbeQuietLooks {
		if w := p.next(false); w != p.fast {
			t.Fatalf("quiet look %d after activity: wait %v, want Probe", i+1, w)
		}
	}
}
