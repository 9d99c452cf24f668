package ops

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/percentile"
	"github.com/delaybridge/delaybridge/internal/store"
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
	Backlog map[outbox.State]map[string]int `json:"backlog"`
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
	// overdueScan bounds the tasks past due of each state that ReadStats
	// looks at; most rows in that range should not exist, and when they
	// do (a consumer down for hours), the summary's count serves.
	overdueScan = 10000
	// latenessSamples bounds the done tasks the lateness summary reads, the
	// newest due first: each sample is a primary-key lookup.
	latenessSamples = 5000
)

// ReadStats reads the outbox's figures at a cost that does not grow with
// the table: the counts come from the summary RefreshStats last wrote (zero
// CountsAt when there is none; see CountStats), the rest from ranges of the
// (state, due_ms) index that stop at a fixed number of rows. grace is how
// far past due an unfinished task must be to count as overdue; window is
// how far back done tasks feed the lateness summary, and 0 skips it.
func ReadStats(ctx context.Context, q outbox.Querier, now time.Time, grace, window time.Duration) (*Stats, error) {
	st := &Stats{Backlog: map[outbox.State]map[string]int{}}
	// One statement, so the counts and their time come from one refresh.
	// The summary's time is the database's clock, as is its age: hosts
	// whose clocks differ agree on how old it is.
	rows, err := q.QueryContext(ctx, `SELECT r.computed_ms, `+store.DBNowMS+`, r.overdue, s.state, s.topic, s.tasks
FROM delay_task_stats_run r LEFT JOIN delay_task_stats s ON TRUE WHERE r.id = 1`)
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1146 {
			return nil, fmt.Errorf("%w: the task count summary (migration 4) is missing; run `delaybridge migrate` (or outbox.Migrate): %v", outbox.ErrSchemaBehind, err)
		}
		return nil, fmt.Errorf("outbox: stats: read summary: %w", err)
	}
	counts := map[string]map[string]int{}
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
		st.CountsAt, summaryOverdue = store.MsTime(computed), int(overdue)
		if state.Valid {
			store.AddCount(counts, state.String, topic.String, int(n.Int64))
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
		st.CountsAge = store.MsTime(dbNow).Sub(st.CountsAt)
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
func CountStats(ctx context.Context, q outbox.Querier, now time.Time, grace, window time.Duration) (*Stats, error) {
	counts, err := store.CountTasks(ctx, q)
	if err != nil {
		return nil, err
	}
	st := &Stats{Backlog: map[outbox.State]map[string]int{}, CountsAt: now, Live: true}
	st.setCounts(counts)
	if err := st.readLive(ctx, q, now, grace, window); err != nil {
		return nil, err
	}
	if st.overdueCapped {
		if st.Overdue, err = store.CountOverdue(ctx, q, now, grace); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// setCounts files counts by state and topic into st: unfinished states by
// topic, finished ones as totals.
func (st *Stats) setCounts(counts map[string]map[string]int) {
	for state, topics := range counts {
		state := outbox.State(state)
		for topic, n := range topics {
			switch state {
			case outbox.StateDone:
				st.Done += n
			case outbox.StateCancelled:
				st.Cancelled += n
			default:
				if st.Backlog[state] == nil {
					st.Backlog[state] = map[string]int{}
				}
				st.Backlog[state][topic] = n
				if state == outbox.StateDead {
					st.Dead += n
				}
			}
		}
	}
}

// readLive fills the figures that bounded index ranges give: the oldest
// pending due time, the overdue counts (of the first overdueScan tasks
// past due of each state, overdueCapped set when there are more) and the
// lateness summary.
func (st *Stats) readLive(ctx context.Context, q outbox.Querier, now time.Time, grace, window time.Duration) error {
	var oldest sql.NullInt64
	if err := q.QueryRowContext(ctx, "SELECT MIN(due_ms) FROM delay_task WHERE state = 'pending'").Scan(&oldest); err != nil {
		return fmt.Errorf("outbox: stats: %w", err)
	}
	if oldest.Valid {
		st.OldestPendingDue = store.MsTime(oldest.Int64)
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
