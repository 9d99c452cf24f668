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

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/percentile"
)

// Stats is the operator's view of the outbox that `delaybridge status`
// prints and the metrics export.
//
// The counts by state (Backlog, Done, Cancelled, Dead) cost a pass over the
// whole table, so ReadStats takes them from a summary a StatsRefresher
// keeps in the background, and CountsAt says when that was. The rest is
// read live from bounded ranges of the (state, due_ms) index.
type Stats struct {
	// Backlog counts unfinished tasks (pending, published, dead) by state
	// and topic.
	Backlog map[State]map[string]int `json:"backlog"`
	// Done and Cancelled count finished tasks still kept.
	Done      int `json:"done"`
	Cancelled int `json:"cancelled"`
	// OldestPendingDue is the due time of the oldest pending task, zero
	// when none is pending.
	OldestPendingDue time.Time `json:"oldest_pending_due,omitzero"`
	// Overdue counts unfinished tasks (pending or published) more than
	// the grace used past their due time: late, whatever the relay, the
	// scanner or a retry did with them since. Dead tasks count under Dead.
	// It is counted live while at most overdueScan (10,000) tasks of each
	// state are past due; beyond that ReadStats reports the larger of what
	// the first 10,000 held and the summary's count (as of CountsAt, with
	// the refresher's grace): a lower bound without a summary.
	Overdue int `json:"overdue"`
	// OverduePending counts the pending tasks among Overdue: tasks the
	// relay has not published though they are past due and the grace, so
	// no relay is running or its publishes fail. It is counted live, of
	// the oldest overdueScan at most.
	OverduePending int `json:"overdue_pending"`
	// overdueCapped is set when more tasks were past due than the live
	// count reads.
	overdueCapped bool
	// Dead counts dead tasks.
	Dead int `json:"dead"`
	// Lateness summarises done_ms − due_ms over the newest tasks due in the
	// window (at most latenessSamples of them).
	Lateness Lateness `json:"lateness_ms"`
	// CountsAt is when Backlog, Done, Cancelled and Dead were counted. It is
	// zero when ReadStats found no summary (no refresher has run yet); those
	// fields are then empty, not zero counts.
	CountsAt time.Time `json:"counts_at,omitzero"`
	// CountsAge is how old the counts were when read, by the database's
	// clock; JSON gives it in whole milliseconds (counts_age_ms), as it
	// gives every other time.
	CountsAge time.Duration `json:"-"`
	// CountsAgeMS is CountsAge in milliseconds, for JSON.
	CountsAgeMS int64 `json:"counts_age_ms"`
	// Live reports that CountStats counted the whole table for this call
	// instead of reading the summary.
	Live bool `json:"live,omitempty"`
}

// Lateness is a summary of handled-minus-due times in milliseconds.
type Lateness struct {
	Count int   `json:"count"`
	P50   int64 `json:"p50"`
	P90   int64 `json:"p90"`
	P99   int64 `json:"p99"`
	Max   int64 `json:"max"`
}

// summarize returns the percentiles of lateness samples in milliseconds.
func summarize(ms []int64) Lateness { return Lateness(percentile.Summarize(ms)) }

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
	// overdueScan bounds the tasks past due of each state that ReadStats
	// looks at; most rows in that range should not exist, and when they
	// do (a consumer down for hours), the summary's count serves.
	overdueScan = 10000
	// latenessSamples bounds the done tasks the lateness summary reads, the
	// newest due first: each sample is a primary-key lookup.
	latenessSamples = 5000
	// statsInsertRows is how many summary rows one INSERT writes.
	statsInsertRows = 500
)

// ErrNotMigrated reports a database whose schema is older than this code
// needs.
var ErrNotMigrated = errors.New("outbox: the database is not migrated to this version")

// ReadStats reads the outbox's figures at a cost that does not grow with
// the table: the counts come from the summary RefreshStats last wrote (zero
// CountsAt when there is none; see CountStats), the rest from ranges of the
// (state, due_ms) index that stop at a fixed number of rows. grace is how
// far past due an unfinished task must be to count as overdue; window is
// how far back done tasks feed the lateness summary, and 0 skips it.
func ReadStats(ctx context.Context, q Querier, now time.Time, grace, window time.Duration) (*Stats, error) {
	st := &Stats{Backlog: map[State]map[string]int{}}
	// One statement, so the counts and their time come from one refresh.
	// The summary's time is the database's clock, as is its age: hosts
	// whose clocks differ agree on how old it is.
	rows, err := q.QueryContext(ctx, `SELECT r.computed_ms, `+dbNowMS+`, r.overdue, s.state, s.topic, s.tasks
FROM delay_task_stats_run r LEFT JOIN delay_task_stats s ON TRUE WHERE r.id = 1`)
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1146 {
			return nil, fmt.Errorf("%w: the task count summary (migration 4) is missing; run `delaybridge migrate` (or outbox.Migrate): %v", ErrNotMigrated, err)
		}
		return nil, fmt.Errorf("outbox: stats: read summary: %w", err)
	}
	counts := map[State]map[string]int{}
	summaryOverdue := 0
	var dbNow int64
	for rows.Next() {
		var computed, overdue int64
		var state, topic sql.NullString
		var n sql.NullInt64
		if err := rows.Scan(&computed, &dbNow, &overdue, &state, &topic, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: stats: read summary: %w", err)
		}
		st.CountsAt, summaryOverdue = msTime(computed), int(overdue)
		if state.Valid {
			addCount(counts, State(state.String), topic.String, int(n.Int64))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: stats: read summary: %w", err)
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("outbox: stats: read summary: %w", err)
	}
	if !st.CountsAt.IsZero() {
		st.setCounts(counts)
		st.CountsAge = msTime(dbNow).Sub(st.CountsAt)
		st.CountsAgeMS = st.CountsAge.Milliseconds()
	}
	if err := st.readLive(ctx, q, now, grace, window); err != nil {
		return nil, err
	}
	if st.overdueCapped {
		// The bounded ranges saw only the first overdueScan tasks past
		// due of each state: what they counted is a lower bound, which
		// the summary's count may raise.
		if !st.CountsAt.IsZero() {
			st.Overdue = max(st.Overdue, summaryOverdue)
		}
	}
	return st, nil
}

// CountStats reads the same figures as ReadStats but counts the whole table
// now, which takes time and database work in proportion to its rows: for
// `status` before any summary exists, and for checking the summary.
func CountStats(ctx context.Context, q Querier, now time.Time, grace, window time.Duration) (*Stats, error) {
	counts, err := countTasks(ctx, q)
	if err != nil {
		return nil, err
	}
	st := &Stats{Backlog: map[State]map[string]int{}, CountsAt: now, Live: true}
	st.setCounts(counts)
	if err := st.readLive(ctx, q, now, grace, window); err != nil {
		return nil, err
	}
	if st.overdueCapped {
		if st.Overdue, err = countOverdue(ctx, q, now, grace); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// RefreshStats counts the outbox by state and topic, and the overdue
// tasks with grace, and replaces the summary ReadStats reads. The
// count reads every row (a walk of the (state, topic) index); run it in the
// background, as StatsRefresher does, not on a request's path.
func RefreshStats(ctx context.Context, db *sql.DB, grace time.Duration) error {
	start := time.Now()
	var computed int64 // when the count began, by the database's clock
	if err := db.QueryRowContext(ctx, "SELECT "+dbNowMS).Scan(&computed); err != nil {
		return fmt.Errorf("outbox: refresh stats: %w", err)
	}
	counts, err := countTasks(ctx, db)
	if err != nil {
		return err
	}
	overdue, err := countOverdue(ctx, db, start, grace)
	if err != nil {
		return err
	}
	took := time.Since(start)

	type row struct {
		state State
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
			args = append(args, string(r.state), r.topic, r.n)
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

// countQuery counts every task by state and topic. It reads the (state,
// due_ms, id, topic) index alone, never a row (migration 0006).
const countQuery = "SELECT state, topic, COUNT(*) FROM delay_task FORCE INDEX (ix_delay_task_state_due) GROUP BY state, topic"

// countTasks counts every task by state and topic.
func countTasks(ctx context.Context, q Querier) (map[State]map[string]int, error) {
	rows, err := q.QueryContext(ctx, countQuery)
	if err != nil {
		return nil, fmt.Errorf("outbox: count tasks: %w", err)
	}
	defer rows.Close()
	counts := map[State]map[string]int{}
	for rows.Next() {
		var state, topic string
		var n int
		if err := rows.Scan(&state, &topic, &n); err != nil {
			return nil, fmt.Errorf("outbox: count tasks: %w", err)
		}
		addCount(counts, State(state), topic, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: count tasks: %w", err)
	}
	return counts, nil
}

func addCount(counts map[State]map[string]int, state State, topic string, n int) {
	if counts[state] == nil {
		counts[state] = map[string]int{}
	}
	counts[state][topic] = n
}

// setCounts files counts by state and topic into st: unfinished states by
// topic, finished ones as totals.
func (st *Stats) setCounts(counts map[State]map[string]int) {
	for state, topics := range counts {
		for topic, n := range topics {
			switch state {
			case StateDone:
				st.Done += n
			case StateCancelled:
				st.Cancelled += n
			default:
				if st.Backlog[state] == nil {
					st.Backlog[state] = map[string]int{}
				}
				st.Backlog[state][topic] = n
				if state == StateDead {
					st.Dead += n
				}
			}
		}
	}
}

// overdueStates are the states whose tasks are overdue once past due by
// the grace: not finished, and not given up (dead counts apart). Overdue
// counts from the due time alone, never from the last publish or a
// backoff: a task 25 minutes late is overdue however recently the scanner
// re-published it. (The scanner decides what to rescue by its own rule.)
const overdueStates = "('pending', 'published')"

// readLive fills the figures that bounded index ranges give: the oldest
// pending due time, the overdue counts (of the first overdueScan tasks
// past due of each state, overdueCapped set when there are more) and the
// lateness summary.
func (st *Stats) readLive(ctx context.Context, q Querier, now time.Time, grace, window time.Duration) error {
	var oldest sql.NullInt64
	if err := q.QueryRowContext(ctx, "SELECT MIN(due_ms) FROM delay_task WHERE state = 'pending'").Scan(&oldest); err != nil {
		return fmt.Errorf("outbox: stats: %w", err)
	}
	if oldest.Valid {
		st.OldestPendingDue = msTime(oldest.Int64)
	}
	cutoff := now.Add(-grace).UnixMilli()
	// Two ranges of the (state, due_ms, id, topic) index, each read in
	// the index alone and stopped after overdueScan + 1 entries.
	var pending, published int
	if err := q.QueryRowContext(ctx, `SELECT
  (SELECT COUNT(*) FROM (SELECT 1 FROM delay_task WHERE state = 'pending' AND due_ms < ? LIMIT ?) p),
  (SELECT COUNT(*) FROM (SELECT 1 FROM delay_task WHERE state = 'published' AND due_ms < ? LIMIT ?) u)`,
		cutoff, overdueScan+1, cutoff, overdueScan+1).Scan(&pending, &published); err != nil {
		return fmt.Errorf("outbox: stats: %w", err)
	}
	st.overdueCapped = pending > overdueScan || published > overdueScan
	pending, published = min(pending, overdueScan), min(published, overdueScan)
	st.Overdue, st.OverduePending = pending+published, pending
	if window <= 0 {
		return nil
	}
	rows, err := q.QueryContext(ctx, `SELECT done_ms - due_ms FROM delay_task
WHERE state = 'done' AND due_ms >= ? AND due_ms <= ? AND done_ms <> 0 ORDER BY due_ms DESC LIMIT ?`,
		now.Add(-window).UnixMilli(), now.UnixMilli(), latenessSamples)
	if err != nil {
		return fmt.Errorf("outbox: stats: %w", err)
	}
	defer rows.Close()
	var samples []int64
	for rows.Next() {
		var l int64
		if err := rows.Scan(&l); err != nil {
			return fmt.Errorf("outbox: stats: %w", err)
		}
		samples = append(samples, l)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outbox: stats: %w", err)
	}
	st.Lateness = summarize(samples)
	return nil
}

// countOverdue counts every overdue task, however many.
func countOverdue(ctx context.Context, q Querier, now time.Time, grace time.Duration) (int, error) {
	var n int
	if err := q.QueryRowContext(ctx, "SELECT COUNT(*) FROM delay_task WHERE state IN "+overdueStates+" AND due_ms < ?",
		now.Add(-grace).UnixMilli()).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: count overdue: %w", err)
	}
	return n, nil
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

// StatsRefresher keeps the summary ReadStats reads up to date. Several
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
	err = conn.QueryRowContext(ctx, "SELECT computed_ms, took_ms, "+dbNowMS+" FROM delay_task_stats_run WHERE id = 1").Scan(&computed, &took, &dbNow)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("outbox: stats refresher: %w", err)
	}
	if err == nil {
		wait := max(r.cfg.Interval, statsIdleFactor*time.Duration(took)*time.Millisecond)
		if msTime(dbNow).Before(msTime(computed).Add(wait)) {
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
