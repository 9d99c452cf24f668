package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/broker"
)

// HandleBatch is Handle for many messages in ONE transaction: it locks
// their task rows (in id order), keeps the messages whose task is pending
// or published at the message's generation, runs fn(ctx, tx, live) once
// for those, marks them all done and commits. It returns an Outcome per
// message, in order. A message without a TaskID, or any error, fails the
// whole batch and commits nothing; callers then fall back to Handle per
// message (broker.ConsumerConfig.Batch does so). A task that appears twice
// in msgs runs once; the second copy is SkippedDone.
func HandleBatch(ctx context.Context, db *sql.DB, msgs []*broker.Message, fn func(ctx context.Context, tx *sql.Tx, live []*broker.Message) error) ([]Outcome, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	ids := make([]any, 0, len(msgs))
	for _, m := range msgs {
		if m.TaskID == 0 {
			return nil, errors.New("outbox: HandleBatch needs messages from the relay (TaskID set)")
		}
		ids = append(ids, m.TaskID)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("outbox: handle batch: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	in := "(?" + strings.Repeat(",?", len(ids)-1) + ")"
	rows, err := tx.QueryContext(ctx, "SELECT id, topic, task_key, state, generation, due_ms, "+dbNowMS+" FROM delay_task WHERE id IN "+in+" ORDER BY id FOR UPDATE", ids...)
	if err != nil {
		return nil, fmt.Errorf("outbox: handle batch: lock tasks: %w", err)
	}
	type row struct {
		topic, key, state string
		gen, due, dbNow   int64
	}
	found := map[int64]row{}
	for rows.Next() {
		var (
			id  int64
			r   row
			key []byte
		)
		if err := rows.Scan(&id, &r.topic, &key, &r.state, &r.gen, &r.due, &r.dbNow); err != nil {
			rows.Close()
			return nil, err
		}
		r.key = string(key)
		found[id] = r
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("outbox: handle batch: lock tasks: %w", err)
	}
	out := make([]Outcome, len(msgs))
	var live []*broker.Message
	var liveIDs []any
	seen := map[int64]bool{}
	for i, m := range msgs {
		r, ok := found[m.TaskID]
		switch {
		case !ok || r.topic != m.Topic || r.key != m.Key:
			out[i] = SkippedMissing
		case seen[m.TaskID] || State(r.state) == StateDone:
			out[i] = SkippedDone
		case State(r.state) == StateCancelled:
			out[i] = SkippedCancelled
		case State(r.state) == StateDead:
			out[i] = SkippedDead
		case m.Generation != r.gen:
			out[i] = SkippedStale
		case r.due > r.dbNow:
			// Not due by the database's clock: fail the batch; one at a
			// time, Handle returns the *broker.EarlyError the runtime waits on.
			return nil, &broker.EarlyError{Remaining: time.Duration(r.due-r.dbNow) * time.Millisecond}
		default:
			out[i] = Handled
			seen[m.TaskID] = true
			live = append(live, m)
			liveIDs = append(liveIDs, m.TaskID)
		}
	}
	if len(live) > 0 {
		if err := fn(ctx, tx, live); err != nil {
			return nil, err
		}
		now := time.Now().UnixMilli()
		args := append([]any{now, now}, liveIDs...)
		if _, err := tx.ExecContext(ctx, "UPDATE delay_task SET state = 'done', done_ms = ?, updated_ms = ? WHERE id IN (?"+strings.Repeat(",?", len(liveIDs)-1)+")", args...); err != nil {
			return nil, fmt.Errorf("outbox: handle batch: mark done: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("outbox: handle batch: commit: %w", err)
	}
	return out, nil
}

// BatchHandler adapts fn into a broker.BatchHandler through HandleBatch:
// fn receives only the messages whose task is still live and changes the
// business rows of all of them in the transaction that marks them done.
func BatchHandler(db *sql.DB, fn func(ctx context.Context, tx *sql.Tx, live []*broker.Message) error) broker.BatchHandler {
	return func(ctx context.Context, msgs []*broker.Message) error {
		_, err := HandleBatch(ctx, db, msgs, fn)
		return err
	}
}
