package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/delaybridge/delaybridge/broker"
)

// Outcome says what Handle did with a message.
type Outcome int

// Handle outcomes. Every outcome but Handled means the business function did
// not run and the message can be acked.
const (
	// Handled: fn ran and the task is done, in one commit.
	Handled Outcome = iota
	// SkippedDone: the task was already done (a duplicate delivery).
	SkippedDone
	// SkippedCancelled: the task was cancelled.
	SkippedCancelled
	// SkippedStale: the message is of an older generation (the task was rescheduled).
	SkippedStale
	// SkippedMissing: no such task (cleaned up, or never written).
	SkippedMissing
	// SkippedDead: the task is dead; replay it to run it.
	SkippedDead
)

func (o Outcome) String() string {
	switch o {
	case Handled:
		return "handled"
	case SkippedDone:
		return "skipped: done"
	case SkippedCancelled:
		return "skipped: cancelled"
	case SkippedStale:
		return "skipped: stale generation"
	case SkippedMissing:
		return "skipped: missing"
	case SkippedDead:
		return "skipped: dead"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Handle runs fn for the task behind msg and marks the task done, in ONE
// transaction: it locks the task row, skips (and reports why) when the task
// is done, cancelled, dead, missing or of a newer generation than msg, runs
// fn(ctx, tx), marks the task done and commits. When fn fails, nothing of it
// is committed and the error is returned for the runtime to retry. Ack the
// message after Handle returns nil: a redelivered message then finds the
// task done, so the business effect happens exactly once.
//
// The task is found by msg.TaskID when set, else by (msg.Topic, msg.Key).
func Handle(ctx context.Context, db *sql.DB, msg *broker.Message, fn func(ctx context.Context, tx *sql.Tx) error) (Outcome, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("outbox: handle %s/%s: begin: %w", msg.Topic, msg.Key, err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	var (
		id    int64
		state string
		gen   int64
	)
	var row *sql.Row
	if msg.TaskID != 0 {
		row = tx.QueryRowContext(ctx, "SELECT id, state, generation FROM delay_task WHERE id = ? AND topic = ? AND task_key = ? FOR UPDATE",
			msg.TaskID, msg.Topic, []byte(msg.Key))
	} else {
		row = tx.QueryRowContext(ctx, "SELECT id, state, generation FROM delay_task WHERE topic = ? AND task_key = ? FOR UPDATE",
			msg.Topic, []byte(msg.Key))
	}
	switch err := row.Scan(&id, &state, &gen); {
	case errors.Is(err, sql.ErrNoRows):
		return SkippedMissing, nil
	case err != nil:
		return 0, fmt.Errorf("outbox: handle %s/%s: lock task: %w", msg.Topic, msg.Key, err)
	}
	switch {
	case State(state) == StateDone:
		return SkippedDone, nil
	case State(state) == StateCancelled:
		return SkippedCancelled, nil
	case State(state) == StateDead:
		return SkippedDead, nil
	case msg.Generation != gen:
		return SkippedStale, nil
	}
	if err := fn(ctx, tx); err != nil {
		return 0, err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE delay_task SET state = 'done', done_ms = ?, updated_ms = ? WHERE id = ?",
		time.Now().UnixMilli(), time.Now().UnixMilli(), id); err != nil {
		return 0, fmt.Errorf("outbox: handle %s/%s: mark done: %w", msg.Topic, msg.Key, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("outbox: handle %s/%s: commit: %w", msg.Topic, msg.Key, err)
	}
	return Handled, nil
}

// Handler adapts fn into a broker.Handler that runs it through Handle, so
// the consumer runtime acks only after the commit and skips what is no
// longer wanted.
func Handler(db *sql.DB, fn func(ctx context.Context, tx *sql.Tx, m *broker.Message) error) broker.Handler {
	return func(ctx context.Context, m *broker.Message) error {
		_, err := Handle(ctx, db, m, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, tx, m) })
		return err
	}
}

// DeadLetter returns a broker.DeadLetter that marks the task of a message
// the runtime gave up on as dead, with the reason, when it is still the
// current generation and not finished; then it passes the delivery on to
// next (for example broker.PublishDead), when next is not nil. A delivery
// that could not be decoded has no task and goes to next only.
func DeadLetter(db *sql.DB, next broker.DeadLetter) broker.DeadLetter {
	return broker.DeadLetterFunc(func(ctx context.Context, d *broker.Delivery, reason error) error {
		if m := d.Message; m != nil {
			msg := "dead: unknown"
			if reason != nil {
				msg = "dead: " + reason.Error()
			}
			if _, err := db.ExecContext(ctx, `UPDATE delay_task SET state = 'dead', last_error = ?, updated_ms = ?
WHERE topic = ? AND task_key = ? AND generation = ? AND state IN ('pending', 'published')`,
				truncate(msg, 1024), time.Now().UnixMilli(), m.Topic, []byte(m.Key), m.Generation); err != nil {
				return fmt.Errorf("outbox: mark %s/%s dead: %w", m.Topic, m.Key, err)
			}
		}
		if next != nil {
			return next.Dead(ctx, d, reason)
		}
		return nil
	})
}
