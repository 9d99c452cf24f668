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

// HandleResult says what Handle did with a message.
type HandleResult int

// Handle's results. Every result but Handled and Snoozed means the business
// function did not run; the message can be acked after any of them.
const (
	// Handled: fn ran and the task is done, in one commit.
	Handled HandleResult = iota
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
	// Snoozed: fn returned Snooze; the task moved to its new time in fn's
	// transaction, and the message can be acked.
	Snoozed
)

func (o HandleResult) String() string {
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
	case Snoozed:
		return "snoozed"
	}
	return fmt.Sprintf("HandleResult(%d)", int(o))
}

// SkipReason is the reason a skipped outcome reports to the consumer
// runtime (broker.Skip), and the metric label it becomes: "done",
// "cancelled", "stale", "missing", "dead" or "snoozed"; empty for Handled.
func (o HandleResult) SkipReason() string {
	switch o {
	case SkippedDone:
		return "done"
	case SkippedCancelled:
		return "cancelled"
	case SkippedStale:
		return "stale"
	case SkippedMissing:
		return "missing"
	case SkippedDead:
		return "dead"
	case Snoozed:
		return "snoozed"
	}
	return ""
}

// asError is what a broker.Handler returns for outcome o: nil for
// Handled, a broker.Skip error naming the reason for the rest, so the
// runtime acks either and its hooks tell them apart.
func (o HandleResult) asError() error {
	if r := o.SkipReason(); r != "" {
		return broker.Skip(r)
	}
	return nil
}

// Handle runs fn for the task behind msg and marks the task done, in ONE
// transaction: it locks the task row, skips (and reports why) when the task
// is done, cancelled, dead, missing or of another generation than msg's,
// returns a *broker.EarlyError when the row's due time has not come by the
// database's clock (whatever the message or this host's clock say), runs
// fn(ctx, tx), marks the task done and commits. When fn fails, nothing of it
// is committed and the error is returned for the runtime to retry. When fn
// returns Snooze, what it wrote commits with the task moved to its new
// time, and the result is Snoozed. Ack the
// message after Handle returns nil: a redelivered message then finds the
// task done, so the business effect happens exactly once.
//
// Once the row is locked, msg.Attempt is set to the row's count of failed
// runs (the attempts column): the consumer runtime decides retry or dead
// by the row, whatever attempt the message claimed.
//
// The task is found by msg.TaskID when set, else by (msg.Topic, msg.Key).
// When the error is not nil the HandleResult means nothing: it is the zero
// value, which is Handled's. An error of the database itself rather than
// of the task (begin failing, the connection lost or refused, read-only,
// too many connections) wraps broker.ErrUnavailable, which the consumer
// runtime gives back without counting an attempt; fn's own errors are
// returned as they are.
func Handle(ctx context.Context, db *sql.DB, msg *broker.Message, fn func(ctx context.Context, tx *sql.Tx) error) (HandleResult, error) {
	switch {
	case db == nil:
		return 0, fmt.Errorf("%w to Handle", ErrNoQuerier)
	case msg == nil:
		return 0, errors.New("outbox: Handle needs a message, got nil")
	case fn == nil:
		return 0, errors.New("outbox: Handle needs a handler function, got nil")
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, beginFailed(ctx, fmt.Errorf("outbox: handle %s/%s: begin: %w", msg.Topic, msg.Key, err))
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	r, err := lockTask(ctx, tx, msg)
	if err != nil {
		return 0, asUnavailable(ctx, fmt.Errorf("outbox: handle %s/%s: lock task: %w", msg.Topic, msg.Key, err))
	}
	if o, err := verdict(r, msg); err != nil || o != Handled {
		return o, err
	}
	msg.Attempt = r.attempts
	result := Handled
	if err := fn(ctx, tx); err != nil {
		s, ok := snoozeOf(err)
		if !ok {
			return 0, err
		}
		if err := snooze(ctx, tx, r, s); err != nil {
			return 0, err
		}
		result = Snoozed
	} else if _, err := tx.ExecContext(ctx, "UPDATE delay_task SET state = 'done', done_ms = ?, updated_ms = ? WHERE id = ?",
		time.Now().UnixMilli(), time.Now().UnixMilli(), r.id); err != nil {
		return 0, asUnavailable(ctx, fmt.Errorf("outbox: handle %s/%s: mark done: %w", msg.Topic, msg.Key, err))
	}
	if err := tx.Commit(); err != nil {
		return 0, asUnavailable(ctx, fmt.Errorf("outbox: handle %s/%s: commit: %w", msg.Topic, msg.Key, err))
	}
	return result, nil
}

// taskRow is a task row a handler locked, with the database's clock read
// in the same statement: what decides whether a message's fn runs.
type taskRow struct {
	id, gen, due, dbNow int64
	attempts, snoozes   int
	topic, key, state   string
}

// lockTask locks the task row of m in tx: by m.TaskID when set (the row
// must still be m's topic and key, not another that took its id), else by
// (m.Topic, m.Key). It returns nil when there is no such task.
func lockTask(ctx context.Context, tx *sql.Tx, m *broker.Message) (*taskRow, error) {
	r := taskRow{topic: m.Topic, key: m.Key}
	var row *sql.Row
	if m.TaskID != 0 {
		row = tx.QueryRowContext(ctx, "SELECT id, state, generation, due_ms, attempts, snoozes, "+store.DBNowMS+" FROM delay_task WHERE id = ? AND topic = ? AND task_key = ? FOR UPDATE",
			m.TaskID, m.Topic, []byte(m.Key))
	} else {
		row = tx.QueryRowContext(ctx, "SELECT id, state, generation, due_ms, attempts, snoozes, "+store.DBNowMS+" FROM delay_task WHERE topic = ? AND task_key = ? FOR UPDATE",
			m.Topic, []byte(m.Key))
	}
	switch err := row.Scan(&r.id, &r.state, &r.gen, &r.due, &r.attempts, &r.snoozes, &r.dbNow); {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return &r, nil
}

// verdict says what becomes of m, whose task row r is locked (nil: there
// is none): an outcome that skips it when the task is missing, done,
// cancelled, dead or of another generation; an *broker.EarlyError when the
// row's due time has not come by the database's clock; Handled and nil
// when fn is to run. Handle and HandleGroup both decide with it.
func verdict(r *taskRow, m *broker.Message) (HandleResult, error) {
	switch {
	case r == nil:
		return SkippedMissing, nil
	case State(r.state) == StateDone:
		return SkippedDone, nil
	case State(r.state) == StateCancelled:
		return SkippedCancelled, nil
	case State(r.state) == StateDead:
		return SkippedDead, nil
	case m.Generation != r.gen:
		return SkippedStale, nil
	case r.due > r.dbNow:
		// The row, not the message, says when the task is due, and the
		// database's clock, not this host's, says whether that has come.
		return 0, &broker.EarlyError{Remaining: time.Duration(r.due-r.dbNow) * time.Millisecond}
	}
	return Handled, nil
}

// BrokerHandler adapts fn into a broker.Handler that runs it through Handle, so
// the consumer runtime acks only after the commit and skips what is no
// longer wanted. A skipped message returns a broker.Skip error naming why
// (HandleResult.SkipReason), which the runtime acks and reports as skipped.
func BrokerHandler(db *sql.DB, fn HandlerFunc) broker.Handler {
	return func(ctx context.Context, m *broker.Message) error {
		o, err := Handle(ctx, db, m, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, tx, m) })
		if err != nil {
			return err
		}
		return o.asError()
	}
}

// DeadLetter returns a broker.DeadLetter that marks the task of a message
// the runtime gave up on as dead, with the reason. What the database
// cannot record it passes on to next (for example broker.PublishDead),
// when next is not nil: a delivery with no task row to mark. A task
// recorded dead is not passed on: its row holds it, and dead replay runs
// it again.
//
// The row is found by the message's task id and must still match its
// topic, key and generation and be unfinished, so a late copy of an old
// message can never kill a newer task of the same key. Only the handler's
// own verdicts mark a row (failed attempts, a permanent error, a next hop
// or retry the broker refused): a delivery that is itself wrong (no or a
// malformed envelope, a due time beyond MaxDelay, another topic than its
// subscription) says nothing about the task, which stays as it is and is
// delivered by its own messages or rescued by the scanner.
//
// When the handler's failure killed the task (broker.ErrHandlerFailed),
// that failed run is added to the row's attempts, so the row counts every
// failed run, as its last_error says.
func DeadLetter(db *sql.DB, next broker.DeadLetter) broker.DeadLetter {
	return broker.DeadLetterFunc(func(ctx context.Context, d *broker.Delivery, reason error) error {
		if m := d.Message; m != nil && m.TaskID != 0 && marksTaskDead(reason) {
			msg := "dead: unknown"
			if reason != nil {
				msg = "dead: " + reason.Error()
			}
			failed := 0
			if errors.Is(reason, broker.ErrHandlerFailed) {
				failed = 1
			}
			res, err := db.ExecContext(ctx, `UPDATE delay_task SET state = 'dead', attempts = attempts + ?, last_error = ?, updated_ms = ?, lease_owner = 0, next_attempt_ms = 0
WHERE id = ? AND topic = ? AND task_key = ? AND generation = ? AND state IN ('pending', 'published')`,
				failed, store.Truncate(msg, 1024), time.Now().UnixMilli(), m.TaskID, m.Topic, []byte(m.Key), m.Generation)
			if err != nil {
				return fmt.Errorf("outbox: mark %s/%s dead: %w", m.Topic, m.Key, err)
			}
			if n, err := res.RowsAffected(); err == nil && n > 0 {
				return nil
			}
		}
		if next != nil {
			return next.Dead(ctx, d, reason)
		}
		return nil
	})
}

// marksTaskDead reports whether a dead-letter reason is a verdict on the
// task rather than on the delivery that carried it.
func marksTaskDead(reason error) bool {
	for _, notTheTask := range []error{broker.ErrNoEnvelope, broker.ErrMalformedEnvelope, broker.ErrTooFar, broker.ErrWrongTopic, broker.ErrForged} {
		if errors.Is(reason, notTheTask) {
			return false
		}
	}
	return true
}

// RecordRetry returns a broker.RetryRecorder that keeps each retry on its
// task row: one more failed run in attempts, counted from the row and
// not from the message, and when it is due again (next_attempt_ms). The
// scanner then leaves the task alone while it waits out its backoff and
// re-publishes it with its attempt, so MaxAttempts holds across rescues.
// Rows are matched as DeadLetter matches them.
//
// A row still pending (a message handled though the relay's claim did not
// commit) becomes published here. The row's lease goes: the broker holds
// a message for it, and the consumer decides its fate from now, so a
// publish failure the relay records late (a confirm lost on the way back)
// leaves it alone rather than put it back to pending.
func RecordRetry(db *sql.DB) broker.RetryRecorder {
	return func(ctx context.Context, m *broker.Message, cause error) error {
		if m.TaskID == 0 {
			return nil
		}
		why := "retrying"
		if cause != nil {
			why = "attempt failed: " + cause.Error()
		}
		now := time.Now().UnixMilli()
		// MariaDB assigns left to right: state changes last, after the
		// assignments that read the old one.
		if _, err := db.ExecContext(ctx, `UPDATE delay_task SET attempts = attempts + 1, next_attempt_ms = ?, last_error = ?, updated_ms = ?,
  published_ms = IF(state = 'pending', ?, published_ms), lease_owner = 0, state = 'published'
WHERE id = ? AND topic = ? AND task_key = ? AND generation = ? AND state IN ('pending', 'published')`,
			m.DeliverAt.UnixMilli(), store.Truncate(why, 1024), now, now, m.TaskID, m.Topic, []byte(m.Key), m.Generation); err != nil {
			return fmt.Errorf("outbox: record retry of %s/%s: %w", m.Topic, m.Key, err)
		}
		return nil
	}
}
