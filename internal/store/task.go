package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Querier runs statements in a transaction or on a database; it has
// outbox.Querier's methods.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// ErrNoQuerier is outbox.ErrNoQuerier: outbox and the operator's reads
// refuse a nil querier with it.
var ErrNoQuerier = errors.New("outbox: no transaction or database given")

// CheckQuerier refuses a nil querier, or a nil *sql.Tx, *sql.DB or
// *sql.Conn in one, naming the call.
func CheckQuerier(call string, q Querier) error {
	nilQ := false
	switch v := q.(type) {
	case nil:
		nilQ = true
	case *sql.Tx:
		nilQ = v == nil
	case *sql.DB:
		nilQ = v == nil
	case *sql.Conn:
		nilQ = v == nil
	}
	if nilQ {
		return fmt.Errorf("%w to %s", ErrNoQuerier, call)
	}
	return nil
}

// DBNowMS is the database's clock in epoch milliseconds, as SQL: the one
// clock every process agrees on.
const DBNowMS = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000"

// MsTime is the UTC time of epoch milliseconds ms.
func MsTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// SelectTask lists the columns ScanTask reads.
const SelectTask = `SELECT id, topic, task_key, due_ms, payload, headers, trace, state, generation,
  publish_attempts, attempts, rescues, snoozes, last_error, created_ms, updated_ms, published_ms, done_ms FROM delay_task`

// SelectTaskRow reads what SelectTask reads with an empty payload and no
// headers or trace: lists never show them, and a payload may be megabytes.
const SelectTaskRow = `SELECT id, topic, task_key, due_ms, x'', NULL, NULL, state, generation,
  publish_attempts, attempts, rescues, snoozes, last_error, created_ms, updated_ms, published_ms, done_ms FROM delay_task`

// TaskRow is a delay_task row as ScanTask reads it, for outbox.TaskInfo.
type TaskRow struct {
	ID                        int64
	Topic, Key                string
	DueAt                     time.Time
	Payload                   []byte
	Headers                   map[string]string
	Trace, State              string
	Generation                int64
	PublishAttempts, Attempts int
	Rescues, Snoozes          int
	LastError                 string
	CreatedAt, UpdatedAt      time.Time
	PublishedAt, DoneAt       time.Time
}

// Scanner is a *sql.Row or *sql.Rows.
type Scanner interface{ Scan(dest ...any) error }

// ScanTask reads one row of SelectTask or SelectTaskRow.
func ScanTask(s Scanner) (*TaskRow, error) {
	var (
		r                       TaskRow
		key                     []byte
		dueMS, createdMS, updMS int64
		headers, trace, lastErr sql.NullString
		publishedMS, doneMS     sql.NullInt64
	)
	if err := s.Scan(&r.ID, &r.Topic, &key, &dueMS, &r.Payload, &headers, &trace, &r.State, &r.Generation,
		&r.PublishAttempts, &r.Attempts, &r.Rescues, &r.Snoozes, &lastErr, &createdMS, &updMS, &publishedMS, &doneMS); err != nil {
		return nil, err
	}
	r.Key = string(key)
	r.DueAt = MsTime(dueMS)
	r.Trace = trace.String
	if headers.Valid {
		// Lenient: a column another producer wrote ({"tenant":1}, or no
		// JSON at all) never fails a read or a list; what no broker
		// carries is left out.
		r.Headers, _ = DecodeHeaders(headers.String)
	}
	r.LastError = lastErr.String
	r.CreatedAt, r.UpdatedAt = MsTime(createdMS), MsTime(updMS)
	// 0 (NULL before migration 2) means not yet.
	if publishedMS.Valid && publishedMS.Int64 != 0 {
		r.PublishedAt = MsTime(publishedMS.Int64)
	}
	if doneMS.Valid && doneMS.Int64 != 0 {
		r.DoneAt = MsTime(doneMS.Int64)
	}
	return &r, nil
}

// CountQuery counts every task by state and topic. It reads the (state,
// due_ms, id, topic) index alone, never a row (migration 0006).
const CountQuery = "SELECT state, topic, COUNT(*) FROM delay_task FORCE INDEX (ix_delay_task_state_due) GROUP BY state, topic"

// CountTasks counts every task by state and topic.
func CountTasks(ctx context.Context, q Querier) (map[string]map[string]int, error) {
	rows, err := q.QueryContext(ctx, CountQuery)
	if err != nil {
		return nil, fmt.Errorf("outbox: count tasks: %w", err)
	}
	defer rows.Close()
	counts := map[string]map[string]int{}
	for rows.Next() {
		var state, topic string
		var n int
		if err := rows.Scan(&state, &topic, &n); err != nil {
			return nil, fmt.Errorf("outbox: count tasks: %w", err)
		}
		AddCount(counts, state, topic, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: count tasks: %w", err)
	}
	return counts, nil
}

// AddCount files n tasks of state and topic into counts.
func AddCount(counts map[string]map[string]int, state, topic string, n int) {
	if counts[state] == nil {
		counts[state] = map[string]int{}
	}
	counts[state][topic] = n
}

// overdueStates are the states whose tasks are overdue once past due by
// the grace: not finished, and not given up (dead counts apart). Overdue
// counts from the due time alone, never from the last publish or a
// backoff: a task 25 minutes late is overdue however recently the scanner
// re-published it. (The scanner decides what to rescue by its own rule.)
const overdueStates = "('pending', 'published')"

// CountOverdue counts every overdue task, however many.
func CountOverdue(ctx context.Context, q Querier, now time.Time, grace time.Duration) (int, error) {
	var n int
	if err := q.QueryRowContext(ctx, "SELECT COUNT(*) FROM delay_task WHERE state IN "+overdueStates+" AND due_ms < ?",
		now.Add(-grace).UnixMilli()).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: count overdue: %w", err)
	}
	return n, nil
}
