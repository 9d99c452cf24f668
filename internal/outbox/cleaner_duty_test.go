package outbox_test

import (
	"math"
	"testing"

	"github.com/delaybridge/delaybridge/internal/outbox"
)

// A duty that is no share of time, NaN included, gets the default: NaN
// compares false with everything, so kept, it would have the cleaner
// delete back to back, the opposite of what the setting is for.
func TestNewCleaner_DutyOutsideZeroToOneGetsTheDefault(t *testing.T) {
	for _, d := range []float64{0, -0.5, 1.5, math.NaN(), math.Inf(1)} {
		if got := outbox.CleanerDuty(outbox.NewCleaner(nil, outbox.CleanerConfig{Duty: d})); got != outbox.DefaultCleanerDuty {
			t.Errorf("Duty %v: the cleaner runs with %v, want the default %v", d, got, outbox.DefaultCleanerDuty)
		}
	}
	if got := outbox.CleanerDuty(outbox.NewCleaner(nil, outbox.CleanerConfig{Duty: 0.5})); got != 0.5 {
		t.Errorf("Duty 0.5: the cleaner runs with %v", got)
	}
}
