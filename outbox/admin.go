package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"
)

// Stats is the operator's view of the outbox that `delaybridge status`
// prints and the metrics export.
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
	// Overdue counts published tasks past due by more than the grace used.
	Overdue int `json:"overdue"`
	// Dead counts dead tasks.
	Dead int `json:"dead"`
	// Lateness summarises done_ms − due_ms over tasks due in the window.
	Lateness Lateness `json:"lateness_ms"`
}

// Lateness is a summary of handled-minus-due times in milliseconds.
type Lateness struct {
	Count int   `json:"count"`
	P50   int64 `json:"p50"`
	P90   int64 `json:"p90"`
	P99   int64 `json:"p99"`
	Max   int64 `json:"max"`
}

// Summarize returns the percentiles of lateness samples in milliseconds.
func Summarize(ms []int64) Lateness {
	if len(ms) == 0 {
		return Lateness{}
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	at := func(p float64) int64 { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return Lateness{Count: len(s), P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: s[len(s)-1]}
}

// ReadStats reads the outbox's figures. grace is how overdue a published
// task must be to count as overdue; window is how far back completed tasks
// feed the lateness summary (at most 100,000 of them). Every query is a
// range of the (state, due_ms) index except the finished totals, which count
// within their state's range.
func ReadStats(ctx context.Context, q Querier, now time.Time, grace, window time.Duration) (*Stats, error) {
	st := &Stats{Backlog: map[State]map[string]int{}}
	rows, err := q.QueryContext(ctx, `SELECT state, topic, COUNT(*) FROM delay_task
WHERE state IN ('pending', 'published', 'dead') GROUP BY state, topic`)
	if err != nil {
		return nil, fmt.Errorf("outbox: stats: %w", err)
	}
	for rows.Next() {
		var state, topic string
		var n int
		if err := rows.Scan(&state, &topic, &n); err != nil {
			rows.Close()
			return nil, err
		}
		if st.Backlog[State(state)] == nil {
			st.Backlog[State(state)] = map[string]int{}
		}
		st.Backlog[State(state)][topic] = n
		if State(state) == StateDead {
			st.Dead += n
		}
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		dst   *int
		query string
		args  []any
	}{
		{&st.Done, "SELECT COUNT(*) FROM delay_task WHERE state = 'done'", nil},
		{&st.Cancelled, "SELECT COUNT(*) FROM delay_task WHERE state = 'cancelled'", nil},
		// Overdue as the scanner counts it: from the latest of due, last
		// publish and the next attempt a retry recorded.
		{&st.Overdue, "SELECT COUNT(*) FROM delay_task WHERE state = 'published' AND due_ms < ? AND published_ms < ? AND next_attempt_ms < ?",
			[]any{now.Add(-grace).UnixMilli(), now.Add(-grace).UnixMilli(), now.Add(-grace).UnixMilli()}},
	} {
		if err := q.QueryRowContext(ctx, c.query, c.args...).Scan(c.dst); err != nil {
			return nil, fmt.Errorf("outbox: stats: %w", err)
		}
	}
	var oldest sql.NullInt64
	if err := q.QueryRowContext(ctx, "SELECT MIN(due_ms) FROM delay_task WHERE state = 'pending'").Scan(&oldest); err != nil {
		return nil, fmt.Errorf("outbox: stats: %w", err)
	}
	if oldest.Valid {
		st.OldestPendingDue = msTime(oldest.Int64)
	}
	lrows, err := q.QueryContext(ctx, `SELECT done_ms - due_ms FROM delay_task
WHERE state = 'done' AND due_ms >= ? AND done_ms <> 0 LIMIT 100000`, now.Add(-window).UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("outbox: stats: %w", err)
	}
	var samples []int64
	for lrows.Next() {
		var l int64
		if err := lrows.Scan(&l); err != nil {
			lrows.Close()
			return nil, err
		}
		samples = append(samples, l)
	}
	if err := lrows.Close(); err != nil {
		return nil, err
	}
	st.Lateness = Summarize(samples)
	return st, nil
}

// ListDead returns up to limit dead tasks, oldest due first.
func ListDead(ctx context.Context, q Querier, limit int) ([]*Info, error) {
	rows, err := q.QueryContext(ctx, selectInfo+" WHERE state = 'dead' ORDER BY due_ms LIMIT ?", limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead: %w", err)
	}
	defer rows.Close()
	var out []*Info
	for rows.Next() {
		i, err := scanInfo(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, i)
	}
	return out, rows.Err()
}

// Replay puts a dead task back to pending with its publish attempts reset
// and a new generation, so the relay publishes it again and Handle runs it.
// A task that is not dead returns ErrNotFound or ErrFinished-style errors
// naming its state.
func Replay(ctx context.Context, q Querier, topic, key string) error {
	now := time.Now().UnixMilli()
	res, err := q.ExecContext(ctx, `UPDATE delay_task SET state = 'pending', generation = generation + 1, publish_attempts = 0,
  next_attempt_ms = 0, last_error = NULL, published_ms = 0, updated_ms = ?, lease_owner = 0, rescues = 0, attempts = 0
WHERE topic = ? AND task_key = ? AND state = 'dead'`, now, topic, []byte(key))
	if err != nil {
		return fmt.Errorf("outbox: replay %s/%s: %w", topic, key, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	st, err := New(Config{}).state(ctx, q, topic, key)
	if err != nil {
		return err
	}
	return fmt.Errorf("outbox: replay %s/%s: task is %s, not dead", topic, key, st)
}
