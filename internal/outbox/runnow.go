package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/store"
)

// RunNow runs fn for the task of (topic, key) in tx, the caller's
// transaction, and marks the task done there, when the task is due by the
// database's clock and pending or published (a dead task waits for its
// replay). It reports whether fn ran.
// A task not yet due, done, cancelled, dead or missing is left as it is,
// and RunNow returns false with no error.
//
// It is the read path's way to act on an expired task at once: the request
// that finds an order overdue cancels it in its own transaction instead of
// waiting for the broker's delivery. The task row stays locked until tx
// ends, so exactly one of RunNow and the consumer runs fn: the other finds
// the task done and skips it.
//
// fn runs in a transaction that may have read before: under REPEATABLE
// READ its plain reads see the snapshot of tx's first plain read, which
// can be older than the task's lock. Call RunNow before other reads, or
// have fn read business rows with locking reads (SELECT ... FOR UPDATE).
//
// When fn fails, RunNow returns its error and the caller rolls tx back;
// the task then stays as it was, and its delivery runs it later. When fn
// returns Snooze, the task moves to its new time in tx and RunNow returns
// false. fn gets a
// message built from the row (Hop 0), as a delivery would carry it.
func RunNow(ctx context.Context, tx *sql.Tx, topic, key string, fn HandlerFunc) (bool, error) {
	if err := checkCall("RunNow", tx, topic, key); err != nil {
		return false, err
	}
	if fn == nil {
		return false, errors.New("outbox: RunNow needs a handler function, got nil")
	}
	m := &broker.Message{Topic: topic, Key: key}
	var (
		state          string
		due, dbNow     int64
		snoozes        int
		headers, trace sql.NullString
		payload        []byte
	)
	err := tx.QueryRowContext(ctx, "SELECT id, state, generation, due_ms, attempts, snoozes, payload, headers, trace, "+store.DBNowMS+
		" FROM delay_task WHERE topic = ? AND task_key = ? FOR UPDATE", topic, []byte(key)).
		Scan(&m.TaskID, &state, &m.Generation, &due, &m.Attempt, &snoozes, &payload, &headers, &trace, &dbNow)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("outbox: run %s/%s now: lock task: %w", topic, key, err)
	}
	if (State(state) != StatePending && State(state) != StatePublished) || due > dbNow {
		return false, nil
	}
	m.DeliverAt = time.UnixMilli(due).UTC()
	m.Payload, m.Trace = payload, trace.String
	if headers.Valid {
		if m.Headers, err = store.DecodeHeaders(headers.String); err != nil {
			return false, fmt.Errorf("outbox: run %s/%s now: headers: %w", topic, key, err)
		}
	}
	if err := fn(ctx, tx, m); err != nil {
		s, ok := snoozeOf(err)
		if !ok {
			return false, err
		}
		// Not yet, says the handler: the task moves on in the caller's
		// transaction, as a delivery's snooze would move it.
		r := &taskRow{id: m.TaskID, topic: topic, key: key, snoozes: snoozes}
		return false, snooze(ctx, tx, r, s)
	}
	now := time.Now().UnixMilli()
	if _, err := tx.ExecContext(ctx, "UPDATE delay_task SET state = 'done', done_ms = ?, updated_ms = ?, lease_owner = 0 WHERE id = ?",
		now, now, m.TaskID); err != nil {
		return false, fmt.Errorf("outbox: run %s/%s now: mark done: %w", topic, key, err)
	}
	return true, nil
}
