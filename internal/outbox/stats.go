package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/store"
)

const (
	// DefaultStatsInterval is how often a StatsRefresher recounts the
	// outbox when counting is quick.
	DefaultStatsInterval = 30 * time.Second
	// DefaultStatsGrace is the grace a StatsRefresher counts overdue tasks
	// with when none is given (delaybridge run passes its scanner's).
	DefaultStatsGrace = 30 * time.Second
	// statsIdleFactor spaces refreshes by this many times the last count's
	// duration, so on a table large enough that counting takes seconds the
	// background count still costs the database at most a tenth of a core.
	statsIdleFactor = 10
	// statsInsertRows is how many summary rows one INSERT writes.
	statsInsertRows = 500
)

// RefreshStats counts the outbox by state and topic, and the overdue
// tasks with grace, and replaces the summary that status and the metrics
// read. The count reads every row (a walk of the (state, topic) index); run
// it in the background, as StatsRefresher does, not on a request's path.
func RefreshStats(ctx context.Context, db *sql.DB, grace time.Duration) error {
	start := time.Now()
	var computed int64 // when the count began, by the database's clock
	if err := db.QueryRowContext(ctx, "SELECT "+store.DBNowMS).Scan(&computed); err != nil {
		return fmt.Errorf("outbox: refresh stats: %w", err)
	}
	// The counts read every row: on a connection whose statement ends
	// with ctx, so a daemon that stops leaves no count running.
	var counts map[string]map[string]int
	var overdue int
	if err := store.OnConn(ctx, db, func(q store.Querier) error {
		var err error
		if counts, err = store.CountTasks(ctx, q); err != nil {
			return err
		}
		overdue, err = store.CountOverdue(ctx, q, start, grace)
		return err
	}); err != nil {
		return err
	}
	took := time.Since(start)

	type row struct {
		state string
		topic string
		n     int
	}
	var all []row
	for state, topics := range counts {
		for topic, n := range topics {
			all = append(all, row{state, topic, n})
		}
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox: refresh stats: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.ExecContext(ctx, "DELETE FROM delay_task_stats"); err != nil {
		return fmt.Errorf("outbox: refresh stats: %w", err)
	}
	for chunk := range slices.Chunk(all, statsInsertRows) {
		args := make([]any, 0, 3*len(chunk))
		for _, r := range chunk {
			args = append(args, r.state, r.topic, r.n)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO delay_task_stats (state, topic, tasks) VALUES "+
			strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", len(chunk)), ", "), args...); err != nil {
			return fmt.Errorf("outbox: refresh stats: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO delay_task_stats_run (id, computed_ms, took_ms, overdue) VALUES (1, ?, ?, ?)
ON DUPLICATE KEY UPDATE computed_ms = VALUES(computed_ms), took_ms = VALUES(took_ms), overdue = VALUES(overdue)`,
		computed, took.Milliseconds(), overdue); err != nil {
		return fmt.Errorf("outbox: refresh stats: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox: refresh stats: %w", err)
	}
	return nil
}

// statsLock is the SQL expression naming the lock refreshers take:
// delaybridge_stats_ and the MD5 of the database name. Lock names are
// server-wide, and daemons of two outboxes on one server must not take
// turns; the hash keeps the name within MySQL's 64 characters.
const statsLock = "CONCAT('delaybridge_stats_', MD5(DATABASE()))"

// StatsRefresherConfig configures a StatsRefresher. Every zero value means
// the default.
type StatsRefresherConfig struct {
	// Interval is how often the summary is recounted; a count that took
	// long spaces the next one by statsIdleFactor times its duration
	// instead, when that is longer. Default DefaultStatsInterval.
	Interval time.Duration
	// Grace is how far past due an unfinished task must be for the
	// summary's overdue count. Default DefaultStatsGrace.
	Grace time.Duration
	// Logger receives the refresher's logs. Default slog.Default().
	Logger *slog.Logger
}

// StatsRefresher keeps the summary RefreshStats writes up to date. Several
// processes may run one: a named lock (statsLock) lets one count at a time,
// and a process skips a refresh another did recently, so the database
// counts once per interval however many daemons run.
type StatsRefresher struct {
	db  *sql.DB
	cfg StatsRefresherConfig
}

// NewStatsRefresher returns a refresher of db's summary.
func NewStatsRefresher(db *sql.DB, cfg StatsRefresherConfig) *StatsRefresher {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultStatsInterval
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultStatsGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &StatsRefresher{db: db, cfg: cfg}
}

// Once refreshes the summary if it is due and no other process is
// refreshing it, and reports whether it did.
func (r *StatsRefresher) Once(ctx context.Context) (bool, error) {
	// GET_LOCK belongs to a session, so take and release it on one
	// connection.
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return false, fmt.Errorf("outbox: stats refresher: %w", err)
	}
	defer conn.Close()
	var lock string
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT "+statsLock+", GET_LOCK("+statsLock+", 0)").Scan(&lock, &got); err != nil {
		return false, fmt.Errorf("outbox: stats refresher: take lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return false, nil
	}
	defer conn.ExecContext(context.Background(), "SELECT RELEASE_LOCK(?)", lock) //nolint:errcheck // released with the connection anyway

	// Due by the database's clock, which wrote computed_ms: daemons whose
	// clocks differ agree on when the next count is due.
	var computed, took, dbNow int64
	err = conn.QueryRowContext(ctx, "SELECT computed_ms, took_ms, "+store.DBNowMS+" FROM delay_task_stats_run WHERE id = 1").Scan(&computed, &took, &dbNow)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("outbox: stats refresher: %w", err)
	}
	if err == nil {
		wait := max(r.cfg.Interval, statsIdleFactor*time.Duration(took)*time.Millisecond)
		if store.MsTime(dbNow).Before(store.MsTime(computed).Add(wait)) {
			return false, nil
		}
	}
	if err := RefreshStats(ctx, r.db, r.cfg.Grace); err != nil {
		return false, err
	}
	return true, nil
}

// Run refreshes the summary whenever it is due, checking every Interval,
// until ctx is done.
func (r *StatsRefresher) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := r.Once(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("delaybridge stats: refreshing the summary failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
