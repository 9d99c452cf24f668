package rabbit

import (
	"strconv"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// Topology returns the settings every relay and consumer on this RabbitMQ
// must share (outbox.Announce compares them): the prefix, the delay mode,
// the ladder's unit and depth, and the longest hop. It reports a Config
// NewPublisher would refuse.
func (c Config) Topology() (broker.Topology, error) {
	c, err := c.withDefaults()
	if err != nil {
		return broker.Topology{}, err
	}
	s := broker.LimitSettings(c.limits())
	s["prefix"] = c.Prefix
	s["mode"] = c.Mode.String()
	if c.Mode == ModeLadder {
		s["unit"] = c.Unit.String()
		s["depth"] = strconv.Itoa(c.Depth)
		if c.DeadLettering != AtLeastOnce {
			// Only when not the default, so processes of earlier versions
			// still agree with one that keeps it.
			s["dead-lettering"] = c.DeadLettering.String()
		}
	}
	return broker.Topology{Broker: "rabbit", Settings: s}, nil
}
