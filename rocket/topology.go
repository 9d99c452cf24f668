package rocket

import (
	"github.com/delaybridge/delaybridge/broker"
)

// Topology returns the settings every relay and consumer on this RocketMQ
// must share (outbox.Announce compares them): the consumer group prefix,
// the delay mode (timer or levels) and the limits. It reports a Config
// NewPublisher would refuse.
func (c Config) Topology() (broker.Topology, error) {
	c, err := c.withDefaults()
	if err != nil {
		return broker.Topology{}, err
	}
	s := broker.LimitSettings(c.Limits)
	s["group_prefix"] = c.GroupPrefix
	s["mode"] = "timer"
	if len(c.Limits.Levels) > 0 {
		s["mode"] = "levels"
	}
	return broker.Topology{Broker: "rocket", Settings: s}, nil
}
