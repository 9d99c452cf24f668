// Package rocket is the RocketMQ adapter: a Publisher that sends RocketMQ 5
// timed messages (or RocketMQ 4.x delay levels) one hop at a time, and a push
// Subscriber in clustering mode whose retries and dead letters are handled by
// the broker package's runtime rather than the broker's fixed retry levels.
//
// Config.Limits selects the mode. Without Levels (TimerLimits) every hop is a
// timer message carrying TIMER_DELAY_MS, a delay relative to the broker's
// receipt, of at most MaxHop. NewPublisher reads the brokers'
// timerMaxDelaySec, timerPrecisionMs and messageDelayLevel (ReadBrokerLimits)
// and uses them where Limits leave a value unset, and refuses limits the
// brokers cannot keep (ErrLimitsExceedBroker). A longer delay is
// chained through several hops by the runtime. A hop the broker refuses as
// too long (code 13, when MaxHop exceeds timerMaxDelaySec) fails with a
// *RejectedError naming both limits. With Levels (LevelLimits) every hop is
// a delay level in the DELAY property, the largest that fits, never above
// the last; this works on RocketMQ 4.x and 5.x brokers alike. Why relative
// timing rather than TIMER_DELIVER_MS is explained on Publisher.
//
// Topics must exist before a Subscriber consumes them: CreateTopic creates
// one and waits until the name servers route it.
//
// rocketmq-client-go logs through a process-wide logger; this package routes
// it into log/slog at error level by default (see RouteClientLogs).
package rocket
