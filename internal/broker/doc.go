// Package broker is the broker-neutral core of delaybridge: the Message and
// the envelope every adapter carries, the Limits of one broker hop and the
// planner that chains hops up to any due time, the Publisher and Subscriber
// seams adapters implement, and the consumer runtime that never runs a handler
// early, retries with backoff and dead-letters poison messages. The public
// package github.com/delaybridge/delaybridge/broker names its contract.
//
// It imports no broker client and no database driver; adapters depend on it,
// never the other way round.
package broker
