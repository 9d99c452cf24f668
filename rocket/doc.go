// Package rocket is the RocketMQ adapter: New builds it from a Config. It
// sends RocketMQ 5 timed messages (or RocketMQ 4.x delay levels) one hop at
// a time, and consumes with a push consumer in clustering mode whose retries
// and dead letters are delaybridge's, not the broker's fixed retry levels.
//
// Config.Limits selects the mode. Without Levels (TimerLimits) every hop is a
// timer message carrying TIMER_DELAY_MS, a delay relative to the broker's
// receipt, of at most MaxHop. Connecting reads the brokers'
// timerMaxDelaySec, timerPrecisionMs and messageDelayLevel
// and uses them where Limits leave a value unset, and refuses limits the
// brokers cannot keep. A longer delay is
// chained through several hops by the runtime. A hop the broker refuses as
// too long (code 13, when MaxHop exceeds timerMaxDelaySec) fails with an
// error naming both limits. With Levels (LevelLimits) every hop is
// a delay level in the DELAY property, the largest that fits, never above
// the last; this works on RocketMQ 4.x and 5.x brokers alike. Why relative
// timing rather than TIMER_DELIVER_MS is explained in docs/brokers.md.
//
// In timer mode a task's last seconds stay off the wheel (Config.Lead, 10 s
// by default): the relay publishes that far ahead as a plain message and
// the consumer holds it until due, so one topic's burst in a slot of the
// wheel delays no other topic.
//
// Topics must exist before they are consumed: Config.CreateTopics creates
// them and waits until the name servers route them.
//
// rocketmq-client-go logs through a process-wide logger; this package routes
// it into log/slog at error level by default.
package rocket
