package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/store"
)

// HandlerFunc is the business function of a task: it runs in tx, the
// transaction that marks the task done, so its writes and the task's
// completion commit together or not at all.
type HandlerFunc func(ctx context.Context, tx *sql.Tx, m *broker.Message) error

// HandleGroup is Handle for several messages in ONE transaction: it locks
// their task rows (in id order), decides each message's result as Handle
// would, runs fn for each live one, marks them done and commits. A task
// that appears twice runs once (the second copy is SkippedDone).
//
// The first attempt runs the messages back to back, with no statement of
// its own between them. When fn fails for a message, that attempt is rolled
// back whole and the group runs once more without it (its error reported
// in errs), each remaining message inside a savepoint of its own: one whose
// fn fails too is rolled back to its savepoint alone and reported, and the
// others are marked done and committed together. A handler that panics
// fails its message the same way. A group where nothing fails pays no
// savepoint round trips.
//
// So a failing message runs fn again for the messages ahead of it in the
// group: their first run was rolled back, their database writes with it,
// but not what fn did outside tx (an HTTP call, an e-mail). Before such a
// second run HandleGroup sets Rerun on the message, so fn can tell; it is
// also left set on a message the caller is to run again after a rolled
// back run (err not nil, or broker.ErrHandleAlone). A group the server
// rolls back to break a deadlock runs again, up to groupDeadlockRetries
// times, with the same flag. A topic whose handler must not repeat its
// calls runs alone (broker.TopicPolicy.GroupSize 1). err reports a
// failure of the group as a whole (begin, lock, commit, or a savepoint the
// server lost): nothing of it is committed and the caller handles each
// message on its own (broker.ConsumerConfig.Group does).
//
// Each live message's Attempt is set to its task row's count of failed
// runs before fn runs, as Handle does. A message whose fn returns Snooze
// keeps what fn wrote, and its task moves to its new time (Snoozed).
//
// A message (with a TaskID) whose task row another transaction holds
// right now is left out rather than waited for: its errs entry wraps
// broker.ErrHandleAlone and the caller handles it on its own with Handle,
// which waits for the row (the consumer runtime does so after the group).
// So one long business transaction holding its task delays that task
// alone. A message without a TaskID is locked by (topic, key) and waited
// for.
//
// Errors of the database itself (begin failing, a connection lost) wrap
// broker.ErrUnavailable, as Handle's do.
func HandleGroup(ctx context.Context, db *sql.DB, msgs []*broker.Message, fn HandlerFunc) (results []HandleResult, errs []error, err error) {
	if len(msgs) == 0 {
		return nil, nil, nil
	}
	switch {
	case db == nil:
		return nil, nil, fmt.Errorf("%w to HandleGroup", ErrNoQuerier)
	case fn == nil:
		return nil, nil, errors.New("outbox: HandleGroup needs a handler function, got nil")
	case slices.Contains(msgs, nil):
		return nil, nil, errors.New("outbox: HandleGroup got a nil message")
	}
	var failed map[int]error
	// ran: fn ran for the message in this transaction; rolled: in one
	// that was rolled back, so a further run is a rerun.
	ran, rolled := make([]bool, len(msgs)), make([]bool, len(msgs))
	for deadlocks := 0; ; {
		clear(ran)
		results, errs, err = handleGroup(ctx, db, msgs, fn, failed, ran, rolled)
		if err != nil {
			for i := range ran {
				rolled[i] = rolled[i] || ran[i]
			}
		}
		var fe *firstFailure
		switch {
		case errors.As(err, &fe) && failed == nil:
			failed = map[int]error{fe.i: fe.err}
		case store.IsDeadlock(err) && deadlocks < groupDeadlockRetries && ctx.Err() == nil:
			// The server chose this group as a deadlock's victim and
			// rolled it back whole; running it again is what it asks
			// for, and far cheaper than one transaction per message.
			deadlocks++
		default:
			// What the caller runs again (the whole group, failed; a
			// message left out) after a run here was rolled back is a
			// rerun too.
			for i, r := range rolled {
				if r && (err != nil || errors.Is(errs[i], broker.ErrHandleAlone)) {
					msgs[i].Rerun = true
				}
			}
			return results, errs, err
		}
	}
}

// heldElsewhere is lockGroup's row for a message whose task row the lock
// skipped: HandleGroup leaves the message out with broker.ErrHandleAlone.
var heldElsewhere = &taskRow{}

// groupDeadlockRetries is how many times HandleGroup runs a group again
// after the server rolled it back to break a deadlock.
const groupDeadlockRetries = 3

// firstFailure is handleGroup's answer, on its first attempt, when fn
// failed for message i: that attempt is rolled back and the group runs
// again without it.
type firstFailure struct {
	i   int
	err error
}

func (f *firstFailure) Error() string {
	return fmt.Sprintf("outbox: handle group: message %d failed (%v); running the group again without it", f.i, f.err)
}

// handleGroup is one transaction of HandleGroup. With failed nil it runs
// every live message back to back and stops at the first fn that fails;
// otherwise it reports the messages in failed with their errors and runs
// each other one inside a savepoint of its own. It sets ran[i] when it
// runs fn for message i, and Rerun on a message rolled[i] says ran before.
func handleGroup(ctx context.Context, db *sql.DB, msgs []*broker.Message, fn HandlerFunc, failed map[int]error, ran, rolled []bool) (results []HandleResult, errs []error, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, beginFailed(ctx, fmt.Errorf("outbox: handle group: begin: %w", err))
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	rows, err := lockGroup(ctx, db, tx, msgs)
	if err != nil {
		return nil, nil, asUnavailable(ctx, err)
	}
	results, errs = make([]HandleResult, len(msgs)), make([]error, len(msgs))
	var doneIDs []int64
	seen := map[int64]bool{}
	for i, m := range msgs {
		r := rows[i]
		if r == heldElsewhere {
			errs[i] = fmt.Errorf("outbox: task %d: its row is held by another transaction: %w", m.TaskID, broker.ErrHandleAlone)
			continue
		}
		if r != nil && seen[r.id] {
			// A second message of a task this group already ran.
			results[i] = SkippedDone
			continue
		}
		switch o, verr := verdict(r, m); {
		case verr != nil:
			errs[i] = verr
			continue
		case o != Handled:
			results[i] = o
			continue
		}
		if ferr, ok := failed[i]; ok {
			errs[i] = ferr
			continue
		}
		// The row's count of failed runs, not the message's, decides
		// whether a failure is the last (see Handle).
		m.Attempt = r.attempts
		if rolled[i] {
			m.Rerun = true
		}
		ran[i] = true
		if failed == nil {
			ferr := runFn(ctx, fn, tx, m)
			if s, ok := snoozeOf(ferr); ok {
				ferr = snooze(ctx, tx, r, s)
				if ferr == nil {
					seen[r.id] = true
					results[i] = Snoozed
					continue
				}
			}
			if ferr != nil {
				return nil, nil, &firstFailure{i: i, err: ferr}
			}
			seen[r.id] = true
			results[i] = Handled
			doneIDs = append(doneIDs, r.id)
			continue
		}
		// One savepoint name, set anew for each message: only the current
		// message's work can be rolled back.
		if _, err := tx.ExecContext(ctx, "SAVEPOINT delaybridge_task"); err != nil {
			return nil, nil, fmt.Errorf("outbox: handle group: savepoint: %w", err)
		}
		ferr := runFn(ctx, fn, tx, m)
		if s, ok := snoozeOf(ferr); ok {
			if ferr = snooze(ctx, tx, r, s); ferr == nil {
				seen[r.id] = true
				results[i] = Snoozed
				continue
			}
		}
		if ferr != nil {
			if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT delaybridge_task"); err != nil {
				return nil, nil, fmt.Errorf("outbox: handle group: %s/%s failed (%v) and its savepoint is gone: %w", m.Topic, m.Key, ferr, err)
			}
			errs[i] = ferr
			continue
		}
		seen[r.id] = true
		results[i] = Handled
		doneIDs = append(doneIDs, r.id)
	}
	now := time.Now().UnixMilli()
	for _, chunk := range store.Chunks(doneIDs) {
		if _, err := tx.ExecContext(ctx, "UPDATE delay_task FORCE INDEX (PRIMARY) SET state = 'done', done_ms = ?, updated_ms = ? WHERE id IN "+store.InList(len(chunk)),
			append([]any{now, now}, chunk...)...); err != nil {
			return nil, nil, asUnavailable(ctx, fmt.Errorf("outbox: handle group: mark done: %w", err))
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, nil, asUnavailable(ctx, fmt.Errorf("outbox: handle group: commit: %w", err))
	}
	return results, errs, nil
}

// runFn runs fn for m, turning a panic into m's error: a message whose
// handler panics fails alone, like one whose handler returns an error,
// instead of failing its whole group (which the consumer's guard would
// make of it). The stack follows the panic's value in the error.
func runFn(ctx context.Context, fn HandlerFunc, tx *sql.Tx, m *broker.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("outbox: handler panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return fn(broker.SpanContext(ctx, m), tx, m)
}

// lockGroup locks the task row of each message, by id where the message
// carries one (in id order, one statement) and by (topic, key) otherwise,
// and returns them by message index; nil where there is no such task.
// The lock by id skips the rows another transaction holds (a business
// transaction cancelling or rescheduling its task, a handler of another
// consumer): their messages get heldElsewhere, so that one slow
// transaction does not hold up the whole group for up to the server's
// lock wait timeout.
func lockGroup(ctx context.Context, db *sql.DB, tx *sql.Tx, msgs []*broker.Message) ([]*taskRow, error) {
	out := make([]*taskRow, len(msgs))
	var ids []int64
	for _, m := range msgs {
		if m.TaskID != 0 {
			ids = append(ids, m.TaskID)
		}
	}
	byID := map[int64]*taskRow{}
	for _, chunk := range store.Chunks(ids) {
		rows, err := tx.QueryContext(ctx, "SELECT id, topic, task_key, state, generation, due_ms, attempts, snoozes, "+store.DBNowMS+
			" FROM delay_task FORCE INDEX (PRIMARY) WHERE id IN "+store.InList(len(chunk))+" ORDER BY id FOR UPDATE SKIP LOCKED", chunk...)
		if err != nil {
			return nil, fmt.Errorf("outbox: handle group: lock tasks: %w", err)
		}
		for rows.Next() {
			var (
				r   taskRow
				key []byte
			)
			if err := rows.Scan(&r.id, &r.topic, &key, &r.state, &r.gen, &r.due, &r.attempts, &r.snoozes, &r.dbNow); err != nil {
				rows.Close()
				return nil, fmt.Errorf("outbox: handle group: lock tasks: %w", err)
			}
			r.key = string(key)
			byID[r.id] = &r
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("outbox: handle group: lock tasks: %w", err)
		}
		if err := rows.Close(); err != nil {
			return nil, fmt.Errorf("outbox: handle group: lock tasks: %w", err)
		}
	}
	held, err := skippedRows(ctx, db, ids, byID)
	if err != nil {
		return nil, err
	}
	for i, m := range msgs {
		if m.TaskID != 0 {
			// The row must be the message's task, not another that took its id.
			switch r := byID[m.TaskID]; {
			case held[m.TaskID]:
				out[i] = heldElsewhere
			case r != nil && r.topic == m.Topic && r.key == m.Key:
				out[i] = r
			}
			continue
		}
		r, err := lockTask(ctx, tx, m)
		if err != nil {
			return nil, fmt.Errorf("outbox: handle group: lock %s/%s: %w", m.Topic, m.Key, err)
		}
		out[i] = r
	}
	return out, nil
}

// skippedRows returns which of ids the locking read skipped although the
// row exists: another transaction holds it. An id that is in neither is a
// task that is gone. It reads without locking, outside the group's
// transaction (a read in it would fix the snapshot the handlers' own reads
// see), and only when some id is missing from locked.
func skippedRows(ctx context.Context, db *sql.DB, ids []int64, locked map[int64]*taskRow) (map[int64]bool, error) {
	var missing []int64
	for _, id := range ids {
		if locked[id] == nil {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return nil, nil
	}
	held := map[int64]bool{}
	for _, chunk := range store.Chunks(missing) {
		rows, err := db.QueryContext(ctx, "SELECT id FROM delay_task FORCE INDEX (PRIMARY) WHERE id IN "+store.InList(len(chunk)), chunk...)
		if err != nil {
			return nil, fmt.Errorf("outbox: handle group: find held tasks: %w", err)
		}
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, fmt.Errorf("outbox: handle group: find held tasks: %w", err)
			}
			held[id] = true
		}
		if err := rows.Close(); err != nil {
			return nil, fmt.Errorf("outbox: handle group: find held tasks: %w", err)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("outbox: handle group: find held tasks: %w", err)
		}
	}
	return held, nil
}

// Group returns the broker.GroupHandler that runs fn for a group of due
// messages through HandleGroup: the same fn BrokerHandler runs one at a time,
// with skipped messages reported as BrokerHandler reports them.
func Group(db *sql.DB, fn HandlerFunc) broker.GroupHandler {
	return func(ctx context.Context, msgs []*broker.Message) ([]error, error) {
		results, errs, err := HandleGroup(ctx, db, msgs, fn)
		if err != nil {
			return nil, err
		}
		for i, o := range results {
			if errs[i] == nil {
				errs[i] = o.asError()
			}
		}
		return errs, nil
	}
}

// NewConsumer returns a consumer runtime that runs fn for every due task
// of its topics with exactly-once effect: one message at a time when they
// arrive one by one, and the messages that are due together in one
// transaction (Group, up to cfg.GroupSize) when they come in numbers. It
// fills in what cfg leaves unset: Group, a DeadLetter that marks the task
// dead (and publishes to broker.DefaultDeadTopic only a delivery no task
// row records), and OnRetry (RecordRetry). Start it with Start and stop
// it with Close.
func NewConsumer(db *sql.DB, sub broker.Subscriber, pub broker.Publisher, fn HandlerFunc, cfg broker.ConsumerConfig) (*broker.Consumer, error) {
	if db == nil || fn == nil {
		return nil, errors.New("outbox: NewConsumer needs a database and a handler")
	}
	if cfg.Group == nil {
		cfg.Group = Group(db, fn)
	}
	if cfg.DeadLetter == nil && pub != nil {
		cfg.DeadLetter = DeadLetter(db, broker.PublishDead(pub, broker.DefaultDeadTopic))
	}
	if cfg.OnRetry == nil {
		cfg.OnRetry = RecordRetry(db)
	}
	return broker.NewConsumer(sub, pub, BrokerHandler(db, fn), cfg)
}
