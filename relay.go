package delaybridge

import (
	"log/slog"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
)

// RelayConfig tunes the relay a Client runs when Config.Relay is set. Every
// zero value means the default delaybridge run uses; docs/tuning.md says
// what each one trades.
type RelayConfig struct {
	// BatchSize is how many rows one claim takes (--batch).
	BatchSize int
	// Workers is how many claim loops run at once. Default: the broker's
	// advice (--relay-workers).
	Workers int
	// Lookahead publishes only rows due within it; a task further out
	// waits in the database. Default: the broker's advice. Negative
	// publishes every pending row at once (--lookahead).
	Lookahead time.Duration
	// IdleMax is the longest wait between claims of an idle relay.
	// Default 1s.
	IdleMax time.Duration
	// RetryInitial and RetryMax shape the per-row delay after a failed
	// publish, doubling per failure. Defaults 1s and 30s.
	RetryInitial, RetryMax time.Duration
	// PublishTimeout bounds one batch's publish. Default 10s
	// (--publish-timeout).
	PublishTimeout time.Duration
	// MaxBatchBytes bounds the payload bytes one claim holds in memory
	// (--relay-batch-bytes).
	MaxBatchBytes int64
	// Topics, when not empty, lists the only topics the relay publishes;
	// a row of another goes dead without reaching the broker
	// (--relay-topics).
	Topics []string
	// MaxTopics bounds the distinct topics the relay publishes since it
	// started; negative means no bound (--relay-max-topics).
	MaxTopics int
	// MaxRate bounds the rows a second the relay publishes; 0 is no
	// bound. It is how fast a backlog drains after a broker outage
	// (--relay-max-rate, docs/tuning.md).
	MaxRate float64
	// TopicRates bounds, by topic, the rows a second the relay publishes
	// of it; the other topics go out as usual (--relay-topic-rate).
	TopicRates map[string]float64
	// Logger receives the relay's logs. Default Config.Logger.
	Logger *slog.Logger
}

// outbox is the relay's own configuration for c. The idle loop's finer
// tunables (the probe, the pace) keep their defaults.
func (c RelayConfig) outbox() outbox.RelayConfig {
	return outbox.RelayConfig{
		BatchSize:      c.BatchSize,
		Workers:        c.Workers,
		Lookahead:      c.Lookahead,
		IdleMax:        c.IdleMax,
		RetryInitial:   c.RetryInitial,
		RetryMax:       c.RetryMax,
		PublishTimeout: c.PublishTimeout,
		MaxBatchBytes:  c.MaxBatchBytes,
		Topics:         c.Topics,
		MaxTopics:      c.MaxTopics,
		MaxRate:        c.MaxRate,
		TopicRates:     c.TopicRates,
		Logger:         c.Logger,
	}
}
