// Package rocket is the RocketMQ adapter: a Publisher that sends RocketMQ 5
// timed messages (or RocketMQ 4.x delay levels) one hop at a time, and a push
// Subscriber in clustering mode whose retries and dead letters are handled by
// the broker package's runtime rather than the broker's fixed retry levels.
package rocket
