package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/delaybridge/delaybridge/broker"
)

// RelayConfig configures a Relay. Every zero value means the default stated.
type RelayConfig struct {
	// BatchSize is how many rows one claim takes. Default 1000: on the
	// 2-core test machine 4 workers × 1000 relayed 18.8–20.6k tasks/s to
	// RabbitMQ where 4 × 500 did 11.9–17.4k (BENCHMARKS.md).
	BatchSize int
	// Workers is how many claim loops run at once; SKIP LOCKED keeps their
	// batches apart. Default 4.
	Workers int
	// Horizon, when set, publishes only rows due within it, keeping
	// far-future tasks out of the broker (cancelling them costs nothing).
	// Default 0: publish every pending row.
	Horizon time.Duration
	// IdleMin and IdleMax bound the idle poll: after an empty claim the
	// wait doubles from IdleMin up to IdleMax; Nudge cuts it short.
	// Defaults 20ms and 1s.
	IdleMin, IdleMax time.Duration
	// RetryInitial and RetryMax shape the per-row delay after a transient
	// publish failure. Defaults 1s and 5m.
	RetryInitial, RetryMax time.Duration
	// Hooks are metric callbacks; any may be nil.
	Hooks RelayHooks
	// Logger receives the relay's logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// RelayHooks are called after each claim, for metrics.
type RelayHooks struct {
	// Published reports rows marked published and how long their publish took.
	Published func(n int, took time.Duration)
	// Failed reports rows whose publish failed transiently.
	Failed func(n int)
	// Dead reports rows the broker rejected for good.
	Dead func(n int)
}

func (c RelayConfig) withDefaults() RelayConfig {
	if c.BatchSize <= 0 {
		c.BatchSize = 1000
	}
	if c.Workers <= 0 {
		c.Workers = 4
	}
	if c.IdleMin <= 0 {
		c.IdleMin = 20 * time.Millisecond
	}
	if c.IdleMax < c.IdleMin {
		c.IdleMax = max(time.Second, c.IdleMin)
	}
	if c.RetryInitial <= 0 {
		c.RetryInitial = time.Second
	}
	if c.RetryMax < c.RetryInitial {
		c.RetryMax = max(5*time.Minute, c.RetryInitial)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Relay moves pending tasks into a broker. It claims rows with SELECT … FOR
// UPDATE SKIP LOCKED inside a transaction, publishes them, and marks them
// published in the same transaction only after the broker confirmed them.
// A relay that dies at any point rolls back and leaves its rows pending for
// the next claim; a row may then be published twice, which Handle makes
// harmless.
type Relay struct {
	db    *sql.DB
	pub   broker.Publisher
	cfg   RelayConfig
	nudge chan struct{}
}

// NewRelay returns a relay from db to pub.
func NewRelay(db *sql.DB, pub broker.Publisher, cfg RelayConfig) (*Relay, error) {
	if db == nil || pub == nil {
		return nil, errors.New("outbox: NewRelay needs a database and a publisher")
	}
	cfg = cfg.withDefaults()
	return &Relay{db: db, pub: pub, cfg: cfg, nudge: make(chan struct{}, cfg.Workers)}, nil
}

// Nudge wakes an idle claim loop at once. Producers in the same process call
// it after committing a Schedule to cut the relay's latency to a round trip.
func (r *Relay) Nudge() {
	select {
	case r.nudge <- struct{}{}:
	default:
	}
}

// Run claims and publishes until ctx is done, then waits for its loops to
// finish their current batch (whose transaction rolls back if the context
// cut it short) and returns nil.
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for i := 0; i < r.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.loop(ctx)
		}()
	}
	wg.Wait()
	return nil
}

func (r *Relay) loop(ctx context.Context) {
	idle := r.cfg.IdleMin
	errWait := &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.3, Multiplier: 2,
		MaxInterval: 10 * time.Second, Clock: backoff.SystemClock}
	errWait.Reset()
	for ctx.Err() == nil {
		n, err := r.Once(ctx)
		var wait time.Duration
		switch {
		case err != nil && ctx.Err() == nil:
			wait = errWait.NextBackOff()
			r.cfg.Logger.Warn("delaybridge relay: claim failed", "err", err, "retry_in", wait)
		case err != nil:
			return
		case n == r.cfg.BatchSize:
			errWait.Reset()
			idle = r.cfg.IdleMin
			continue
		default:
			errWait.Reset()
			wait = idle
			idle = min(2*idle, r.cfg.IdleMax)
			if n > 0 {
				idle = r.cfg.IdleMin
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-r.nudge:
			t.Stop()
			idle = r.cfg.IdleMin
		case <-t.C:
		}
	}
}

// Once claims one batch, publishes it and records the outcome, returning
// how many rows it claimed. If ctx ends before the commit, the whole batch
// stays pending.
func (r *Relay) Once(ctx context.Context) (int, error) {
	now := r.cfg.Now()
	limit := int64(1<<63 - 1)
	if r.cfg.Horizon > 0 {
		limit = now.Add(r.cfg.Horizon).UnixMilli()
	}
	tx, err := BeginClaim(ctx, r.db)
	if err != nil {
		return 0, fmt.Errorf("outbox relay: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	batch, err := Claim(ctx, tx, StatePending, limit, now.UnixMilli(), r.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("outbox relay: %w", err)
	}
	if len(batch) == 0 {
		return 0, tx.Commit()
	}

	msgs := make([]*broker.Message, len(batch))
	for i, c := range batch {
		msgs[i] = c.Message
		if c.HeadersErr != nil {
			r.cfg.Logger.Warn("delaybridge relay: unreadable headers dropped", "id", c.Message.TaskID, "err", c.HeadersErr)
		}
	}
	start := time.Now()
	perr := r.pub.Publish(ctx, msgs...)
	took := time.Since(start)
	if ctx.Err() != nil {
		return 0, ctx.Err() // roll back: every row stays pending
	}
	results := broker.PublishResults(perr, len(batch))
	var ok []int64
	failed, dead := 0, 0
	stamp := r.cfg.Now().UnixMilli()
	for i, c := range batch {
		switch err := results[i]; {
		case err == nil:
			ok = append(ok, c.Message.TaskID)
		case broker.IsPermanent(err):
			dead++
			if _, err := tx.ExecContext(ctx, "UPDATE delay_task SET state = 'dead', publish_attempts = publish_attempts + 1, last_error = ?, updated_ms = ? WHERE id = ?",
				truncate("publish rejected: "+err.Error(), 1024), stamp, c.Message.TaskID); err != nil {
				return 0, fmt.Errorf("outbox relay: mark dead: %w", err)
			}
		default:
			failed++
			next := stamp + r.retryDelay(c.PublishAttempts+1).Milliseconds()
			if _, err := tx.ExecContext(ctx, "UPDATE delay_task SET publish_attempts = publish_attempts + 1, next_attempt_ms = ?, last_error = ?, updated_ms = ? WHERE id = ?",
				next, truncate("publish failed: "+err.Error(), 1024), stamp, c.Message.TaskID); err != nil {
				return 0, fmt.Errorf("outbox relay: record failure: %w", err)
			}
		}
	}
	if len(ok) > 0 {
		q := "UPDATE delay_task SET state = 'published', published_ms = ?, updated_ms = ?, publish_attempts = publish_attempts + 1, last_error = NULL WHERE id IN (?" +
			strings.Repeat(",?", len(ok)-1) + ")"
		args := make([]any, 0, len(ok)+2)
		args = append(args, stamp, stamp)
		for _, id := range ok {
			args = append(args, id)
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return 0, fmt.Errorf("outbox relay: mark published: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("outbox relay: commit: %w", err)
	}
	if failed > 0 {
		r.cfg.Logger.Warn("delaybridge relay: publish failed; rows stay pending", "rows", failed, "err", perr)
		if r.cfg.Hooks.Failed != nil {
			r.cfg.Hooks.Failed(failed)
		}
	}
	if dead > 0 {
		r.cfg.Logger.Error("delaybridge relay: broker rejected rows for good; marked dead", "rows", dead, "err", perr)
		if r.cfg.Hooks.Dead != nil {
			r.cfg.Hooks.Dead(dead)
		}
	}
	if len(ok) > 0 && r.cfg.Hooks.Published != nil {
		r.cfg.Hooks.Published(len(ok), took)
	}
	return len(batch), nil
}

// retryDelay is the wait before publish attempt n+1 of a row.
func (r *Relay) retryDelay(n int) time.Duration {
	d := r.cfg.RetryInitial
	for i := 1; i < n && d < r.cfg.RetryMax; i++ {
		d *= 2
	}
	return min(d, r.cfg.RetryMax)
}
