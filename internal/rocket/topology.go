package rocket

import (
	"github.com/delaybridge/delaybridge/internal/broker"
)

// Topology returns the settings every relay and consumer on this RocketMQ
// must share (outbox.Announce compares them): the delay mode (timer or
// levels) and the limits. The consumer group prefix is not one: it names
// only consumer groups, which a relay has none of, and services with
// different prefixes each read every message of their topics (one of them
// handles each task, the others find it done), so no prefix leaves a task
// unread. It reports a Config NewPublisher would refuse.
func (c Config) Topology() (broker.Topology, error) {
	c, err := c.withDefaults()
	if err != nil {
		return broker.Topology{}, err
	}
	s := broker.LimitSettings(c.Limits)
	s["mode"] = "timer"
	if len(c.Limits.Levels) > 0 {
		s["mode"] = "levels"
	}
	return broker.Topology{Broker: "rocket", Settings: s}, nil
}
