package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/store"
)

// writer writes and changes tasks under one config. The package-level
// functions use the default limits; tests set others.
type writer struct {
	cfg config
}

// newWriter returns a writer with cfg's limits.
func newWriter(cfg config) *writer { return &writer{cfg: cfg.withDefaults()} }

// Schedule writes t as a pending task and returns its id. Pass the caller's
// transaction: the task then exists exactly when the caller's own writes
// commit. Invalid input returns a typed error (broker.ErrInvalidTopic,
// broker.ErrInvalidKey, broker.ErrInvalidMessage, broker.ErrTooFar,
// ErrInvalidDue, ErrPayloadTooLarge) before anything is written.
//
// A (topic, key) that already has a task, in any state, returns
// ErrDuplicate and changes nothing, even when the new task is identical: a
// second Schedule for the same order is a bug or a retry the caller should
// see. Use Reschedule to move a task that is not finished; a finished one
// keeps its (topic, key) until the cleaner deletes its row, so something
// that recurs takes a key per occurrence.
func Schedule(ctx context.Context, q Querier, t Task) (int64, error) {
	return newWriter(config{}).Schedule(ctx, q, t)
}

// Cancel marks a pending, published or dead task cancelled, so its message,
// if one is in flight, is skipped by Handle. Cancelling a cancelled task is
// a no-op; a done task returns ErrFinished (the handler won the race); a
// missing one returns ErrNotFound.
//
// Called in the same transaction as a business update (pay an order), it
// locks the task row; do it before touching the business row, because Handle
// locks the task first and the business row second, and the same order
// everywhere avoids deadlocks.
func Cancel(ctx context.Context, q Querier, topic, key string) error {
	return newWriter(config{}).Cancel(ctx, q, topic, key)
}

// Reschedule moves a not yet finished task to due. It bumps the generation,
// so a message already in a broker for the old time is skipped by Handle,
// and puts the task back to pending for the relay to publish anew. Done and
// cancelled tasks return ErrFinished; missing ones ErrNotFound.
func Reschedule(ctx context.Context, q Querier, topic, key string, due time.Time) error {
	return newWriter(config{}).Reschedule(ctx, q, topic, key, due)
}

// Get reads the task (topic, key), or returns ErrNotFound.
func Get(ctx context.Context, q Querier, topic, key string) (*TaskInfo, error) {
	return newWriter(config{}).Get(ctx, q, topic, key)
}

// Schedule is the package's Schedule under o's limits.
func (o *writer) Schedule(ctx context.Context, q Querier, t Task) (int64, error) {
	if err := store.CheckQuerier("Schedule", q); err != nil {
		return 0, err
	}
	if t.Trace == "" {
		t.Trace = broker.TraceOf(ctx)
	}
	if err := o.cfg.validate(&t); err != nil {
		return 0, err
	}
	headers, err := store.EncodeHeaders(t.Headers)
	if err != nil {
		return 0, err
	}
	var trace any
	if t.Trace != "" {
		trace = t.Trace
	}
	payload := t.Payload
	if payload == nil {
		payload = []byte{}
	}
	now := o.cfg.Now().UnixMilli()
	res, err := q.ExecContext(ctx, `INSERT INTO delay_task
  (topic, task_key, due_ms, payload, headers, trace, state, created_ms, updated_ms)
VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?)`,
		t.Topic, []byte(t.Key), broker.DueMillis(t.DueAt), payload, headers, trace, now, now)
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1062 {
			return 0, fmt.Errorf("%w: %s/%q", ErrDuplicate, t.Topic, t.Key)
		}
		return 0, fmt.Errorf("outbox: schedule %s/%s: %w", t.Topic, t.Key, err)
	}
	return res.LastInsertId()
}

// ScheduleMany is Schedule for many tasks at once, in multi-row INSERTs of
// at most scheduleManyRows rows or scheduleManyBytes payload bytes each:
// one round trip writes hundreds of tasks, for a transaction that creates
// many orders (a batch import, a flash-sale pre-order). Every task is
// checked before anything is written, and the error names the first
// invalid one by its index. A (topic, key) that appears twice in tasks is
// refused the same way (ErrDuplicate naming both indexes), before anything
// is written. One that already has a task returns ErrDuplicate from the
// statement that meets it: pass q a transaction and roll it back then, as
// the statements before the failing one did write.
func ScheduleMany(ctx context.Context, q Querier, tasks []Task) error {
	return newWriter(config{}).ScheduleMany(ctx, q, tasks)
}

// ScheduleMany is the package's ScheduleMany under o's limits.
func (o *writer) ScheduleMany(ctx context.Context, q Querier, tasks []Task) error {
	if err := store.CheckQuerier("ScheduleMany", q); err != nil {
		return err
	}
	type row struct {
		t       Task
		headers any
		trace   any
	}
	rows := make([]row, len(tasks))
	type topicKey struct{ topic, key string }
	seen := make(map[topicKey]int, len(tasks))
	trace := broker.TraceOf(ctx)
	for i, t := range tasks {
		if t.Trace == "" {
			t.Trace = trace
		}
		if err := o.cfg.validate(&t); err != nil {
			return fmt.Errorf("task %d: %w", i, err)
		}
		if first, ok := seen[topicKey{t.Topic, t.Key}]; ok {
			return fmt.Errorf("task %d: %w: tasks %d and %d have the same topic and key", i, ErrDuplicate, first, i)
		}
		seen[topicKey{t.Topic, t.Key}] = i
		headers, err := store.EncodeHeaders(t.Headers)
		if err != nil {
			return fmt.Errorf("task %d: %w", i, err)
		}
		rows[i] = row{t: t, headers: headers}
		if t.Trace != "" {
			rows[i].trace = t.Trace
		}
		if rows[i].t.Payload == nil {
			rows[i].t.Payload = []byte{}
		}
	}
	now := o.cfg.Now().UnixMilli()
	for len(rows) > 0 {
		n, bytes := 0, 0
		for n < len(rows) && n < scheduleManyRows && (n == 0 || bytes+len(rows[n].t.Payload) <= scheduleManyBytes) {
			bytes += len(rows[n].t.Payload)
			n++
		}
		args := make([]any, 0, 8*n)
		for _, r := range rows[:n] {
			args = append(args, r.t.Topic, []byte(r.t.Key), broker.DueMillis(r.t.DueAt), r.t.Payload, r.headers, r.trace, now, now)
		}
		_, err := q.ExecContext(ctx, `INSERT INTO delay_task
  (topic, task_key, due_ms, payload, headers, trace, state, created_ms, updated_ms)
VALUES `+strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, 'pending', ?, ?),", n), ","), args...)
		if err != nil {
			var me *mysql.MySQLError
			if errors.As(err, &me) && me.Number == 1062 {
				return fmt.Errorf("%w: %s", ErrDuplicate, me.Message)
			}
			return fmt.Errorf("outbox: schedule %d tasks: %w", n, err)
		}
		rows = rows[n:]
	}
	return nil
}

// scheduleManyRows and scheduleManyBytes bound one ScheduleMany statement:
// 4,000 placeholders, far below the server's 65,535, and a packet far
// below max_allowed_packet's 16 MiB default.
const (
	scheduleManyRows  = 500
	scheduleManyBytes = 4 << 20
)

// Cancel is the package's Cancel under o's limits.
func (o *writer) Cancel(ctx context.Context, q Querier, topic, key string) error {
	if err := checkCall("Cancel", q, topic, key); err != nil {
		return err
	}
	now := o.cfg.Now().UnixMilli()
	res, err := q.ExecContext(ctx, `UPDATE delay_task SET state = 'cancelled', updated_ms = ?
WHERE topic = ? AND task_key = ? AND state IN ('pending', 'published', 'dead')`, now, topic, []byte(key))
	if err != nil {
		return fmt.Errorf("outbox: cancel %s/%s: %w", topic, key, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	st, err := o.state(ctx, q, topic, key)
	if err != nil {
		return err
	}
	if st == StateCancelled {
		return nil
	}
	return fmt.Errorf("%w: %s/%s is %s", ErrFinished, topic, key, st)
}

// Reschedule is the package's Reschedule under o's limits.
func (o *writer) Reschedule(ctx context.Context, q Querier, topic, key string, due time.Time) error {
	if err := checkCall("Reschedule", q, topic, key); err != nil {
		return err
	}
	if err := o.cfg.validateDue(due); err != nil {
		return err
	}
	now := o.cfg.Now().UnixMilli()
	// The caller's span, when there is one, becomes the task's: the trace
	// that moved it is the one its handler links to.
	var trace any
	if tr := broker.TraceOf(ctx); tr != "" {
		trace = tr
	}
	res, err := q.ExecContext(ctx, `UPDATE delay_task
SET due_ms = ?, generation = generation + 1, state = 'pending', publish_attempts = 0,
    next_attempt_ms = 0, last_error = NULL, published_ms = 0, updated_ms = ?,
    lease_owner = 0, rescues = 0, attempts = 0, snoozes = 0, trace = COALESCE(?, trace)
WHERE topic = ? AND task_key = ? AND state IN ('pending', 'published', 'dead')`, broker.DueMillis(due), now, trace, topic, []byte(key))
	if err != nil {
		return fmt.Errorf("outbox: reschedule %s/%s: %w", topic, key, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	st, err := o.state(ctx, q, topic, key)
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: %s/%s is %s", ErrFinished, topic, key, st)
}

func (o *writer) state(ctx context.Context, q Querier, topic, key string) (State, error) {
	var st string
	err := q.QueryRowContext(ctx, "SELECT state FROM delay_task WHERE topic = ? AND task_key = ?", topic, []byte(key)).Scan(&st)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("%w: %s/%q", ErrNotFound, topic, key)
	}
	if err != nil {
		return "", fmt.Errorf("outbox: read %s/%s: %w", topic, key, err)
	}
	return State(st), nil
}

// Get is the package's Get under o's limits.
func (o *writer) Get(ctx context.Context, q Querier, topic, key string) (*TaskInfo, error) {
	if err := checkCall("Get", q, topic, key); err != nil {
		return nil, err
	}
	row := q.QueryRowContext(ctx, store.SelectTask+" WHERE topic = ? AND task_key = ?", topic, []byte(key))
	info, err := scanInfo(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s/%q", ErrNotFound, topic, key)
	}
	return info, err
}

// scanInfo reads a row of store.SelectTask or store.SelectTaskRow.
func scanInfo(s store.Scanner) (*TaskInfo, error) {
	r, err := store.ScanTask(s)
	if err != nil {
		return nil, err
	}
	return infoOf(r), nil
}

// infoOf is r as a TaskInfo.
func infoOf(r *store.TaskRow) *TaskInfo {
	return &TaskInfo{ID: r.ID, Task: Task{Topic: r.Topic, Key: r.Key, DueAt: r.DueAt, Payload: r.Payload, Headers: r.Headers, Trace: r.Trace},
		State: State(r.State), Generation: r.Generation, PublishAttempts: r.PublishAttempts, Attempts: r.Attempts, Rescues: r.Rescues, Snoozes: r.Snoozes,
		LastError: r.LastError, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, PublishedAt: r.PublishedAt, DoneAt: r.DoneAt}
}
