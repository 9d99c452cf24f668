package cli

import (
	"fmt"
	"time"
)

// CheckProbeDelay refuses a --probe-delay the precision probe cannot use: a
// probe due at once or in the past arrives at once whether the broker's
// timers are on or off.
func CheckProbeDelay(probe time.Duration) error {
	if probe <= 0 {
		return fmt.Errorf("--probe-delay %v: want a positive duration (a probe due at once cannot tell whether the broker's timers are on)", probe)
	}
	return nil
}
