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

// A quiet relay still looks often enough that a task another process
// schedules due now reaches the broker within 100 ms: the default ProbeMax
// leaves room for the claim and the publish after the look. A longer Probe
// raises it to Probe, and a ProbeMax the user chose is kept.
func TestRelayConfig_QuietProbeLeavesRoomUnder100ms(t *testing.T) {
	for _, tc := range []struct {
		cfg  RelayConfig
		want time.Duration
	}{
		{RelayConfig{}, DefaultProbeMax},
		{RelayConfig{Probe: 150 * time.Millisecond}, 150 * time.Millisecond},
		{RelayConfig{ProbeMax: time.Second}, time.Second},
	} {
		if got := tc.cfg.withDefaults().ProbeMax; got != tc.want {
			t.Errorf("RelayConfig%+v: ProbeMax %v, want %v", tc.cfg, got, tc.want)
		}
	}
	if DefaultProbeMax > 80*time.Millisecond || DefaultProbeMax < DefaultProbe {
		t.Errorf("DefaultProbeMax %v: want from Probe (%v) to 80 ms, so a look, a claim and a publish fit in 100 ms", DefaultProbeMax, DefaultProbe)
	}
}
