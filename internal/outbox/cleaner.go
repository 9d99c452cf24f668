package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"
)

// CleanerConfig configures a Cleaner. Every zero value means the default.
type CleanerConfig struct {
	// Retention keeps done and cancelled tasks this long after their due
	// time, so duplicates arriving late still find them. Default
	// DefaultRetention.
	Retention time.Duration
	// BatchSize is how many rows one DELETE removes. Default
	// DefaultCleanerBatchSize.
	BatchSize int
	// Duty is the share of a pass's wall time spent deleting: after each
	// batch that took d the cleaner pauses d × (1 − Duty) / Duty, so the
	// order transactions that share the table and the server's cores get
	// the rest. Default DefaultCleanerDuty; 1 deletes back to back.
	Duty float64
	// Interval is the pause between passes. Default DefaultCleanerInterval.
	Interval time.Duration
	// Logger receives the cleaner's logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// DefaultCleanerDuty keeps the cleaner deleting 15 % of the time. Deleting
// back to back takes most of a small server's cores and slows the order
// transaction. At this duty, with DefaultCleanerBatchSize, the cleaner
// still deletes faster than a busy service finishes tasks (BENCHMARKS.md,
// "The cleaner").
const DefaultCleanerDuty = 0.15

// Defaults of the other CleanerConfig fields.
const (
	// DefaultRetention keeps finished tasks a week after their due time
	// and after they finished, whichever is later (delaybridge run
	// --retention).
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultCleanerBatchSize is the rows one DELETE removes. Fewer, larger
	// batches with longer pauses between them slow the order transaction
	// less than many small ones at the same rate; the rows it locks are
	// finished tasks past retention, which nothing else touches.
	DefaultCleanerBatchSize = 5000
	// DefaultCleanerInterval is the pause between passes.
	DefaultCleanerInterval = time.Minute
)

// Cleaner deletes finished tasks past their retention in small batches,
// each its own short READ COMMITTED transaction (no gap locks), paced by
// Duty, so it never holds long locks, bloats a transaction or crowds out
// the business transactions.
type Cleaner struct {
	db  *sql.DB
	cfg CleanerConfig
}

// NewCleaner returns a cleaner of db.
func NewCleaner(db *sql.DB, cfg CleanerConfig) *Cleaner {
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultCleanerBatchSize
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultCleanerInterval
	}
	if !(cfg.Duty > 0 && cfg.Duty <= 1) { // NaN too
		cfg.Duty = DefaultCleanerDuty
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Cleaner{db: db, cfg: cfg}
}

// Once deletes every done or cancelled task due, and finished, before now
// minus the retention, one paced batch at a time, and returns how many it
// deleted.
func (c *Cleaner) Once(ctx context.Context) (int64, error) {
	if c.db == nil {
		return 0, fmt.Errorf("%w to the cleaner (NewCleaner got a nil *sql.DB)", ErrNoQuerier)
	}
	cutoff := c.cfg.Now().Add(-c.cfg.Retention).UnixMilli()
	var total int64
	for {
		start := time.Now()
		n, err := c.batch(ctx, cutoff)
		total += n
		if err != nil {
			return total, fmt.Errorf("outbox cleaner: %w", err)
		}
		if n < int64(c.cfg.BatchSize) {
			return total, nil
		}
		if c.cfg.Duty < 1 {
			took := time.Since(start)
			pause := time.Duration(float64(took) * (1 - c.cfg.Duty) / c.cfg.Duty)
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return total, nil
			case <-t.C:
			}
		}
	}
}

// batch deletes one batch in a READ COMMITTED transaction: the range of
// the (state, due_ms) index it walks is locked row by row, without the gap
// locks REPEATABLE READ would take next to where tasks are being marked
// done.
func (c *Cleaner) batch(ctx context.Context, cutoff int64) (int64, error) {
	tx, err := c.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	// Past the retention by its due time (the index's range) and by when it
	// finished (updated_ms): a task replayed long after it was due, or
	// handled after a long outage, is kept as long as any other.
	res, err := tx.ExecContext(ctx, `DELETE FROM delay_task WHERE state IN ('done', 'cancelled') AND due_ms < ? AND updated_ms < ?
ORDER BY state, due_ms LIMIT ?`, cutoff, cutoff, c.cfg.BatchSize)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return n, nil
}

// Run cleans every Interval until ctx is done.
func (c *Cleaner) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		if n, err := c.Once(ctx); err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("delaybridge cleaner: pass failed", "err", err)
		} else if n > 0 {
			c.cfg.Logger.Info("delaybridge cleaner: deleted finished tasks", "rows", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
