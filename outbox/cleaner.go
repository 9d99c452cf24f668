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
	// time, so duplicates arriving late still find them. Default 7 days.
	Retention time.Duration
	// BatchSize is how many rows one DELETE removes. Default 1000.
	BatchSize int
	// Interval is the pause between passes. Default 1 minute.
	Interval time.Duration
	// Logger receives the cleaner's logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Cleaner deletes finished tasks past their retention in small batches, so
// it never holds long locks or bloats a transaction.
type Cleaner struct {
	db  *sql.DB
	cfg CleanerConfig
}

// NewCleaner returns a cleaner of db.
func NewCleaner(db *sql.DB, cfg CleanerConfig) *Cleaner {
	if cfg.Retention <= 0 {
		cfg.Retention = 7 * 24 * time.Hour
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 1000
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Cleaner{db: db, cfg: cfg}
}

// Once deletes every done or cancelled task due before now minus the
// retention, one batch at a time, and returns how many it deleted.
func (c *Cleaner) Once(ctx context.Context) (int64, error) {
	cutoff := c.cfg.Now().Add(-c.cfg.Retention).UnixMilli()
	var total int64
	for {
		res, err := c.db.ExecContext(ctx, `DELETE FROM delay_task WHERE state IN ('done', 'cancelled') AND due_ms < ?
ORDER BY state, due_ms LIMIT ?`, cutoff, c.cfg.BatchSize)
		if err != nil {
			return total, fmt.Errorf("outbox cleaner: %w", err)
		}
		n, _ := res.RowsAffected()
		total += n
		if n < int64(c.cfg.BatchSize) {
			return total, nil
		}
	}
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
