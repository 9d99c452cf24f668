package rocket

import (
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/rocket"
)

// Config configures the RocketMQ adapter. Zero fields take their defaults;
// each field says its default, and docs/flags.md explains the flag that
// sets it.
type Config = rocket.Config

// New returns the RocketMQ adapter for delaybridge.Config.Broker. It does not
// connect; the client connects when it starts.
func New(cfg Config) broker.Adapter { return rocket.New(cfg) }

// TimerLimits returns the limits of RocketMQ 5 timer mode for a broker with
// timerMaxDelaySec = maxDelay and timerPrecisionMs = precision. Zero values
// are read from the broker when the adapter connects.
func TimerLimits(maxDelay, precision time.Duration) broker.Limits {
	return rocket.TimerLimits(maxDelay, precision)
}

// LevelLimits returns the limits of level mode (RocketMQ 4.x, or 5.x
// without timers) for a broker whose messageDelayLevel list is levels.
// maxHop, when not zero, keeps hops to the levels at or below it.
func LevelLimits(levels []time.Duration, maxHop time.Duration) broker.Limits {
	return rocket.LevelLimits(levels, maxHop)
}
