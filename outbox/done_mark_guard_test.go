package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/outbox"
)

// refuseDone makes the database refuse every update of a task to done (a
// lost connection or a full disk, in life): a trigger fails the statement,
// and only the statement, so the transaction around it stays open and
// would commit whatever came before it.
func (b *bundle) refuseDone(t *testing.T) {
	t.Helper()
	if _, err := b.db.ExecContext(b.ctx, `CREATE TRIGGER refuse_done BEFORE UPDATE ON delay_task FOR EACH ROW
BEGIN IF NEW.state = 'done' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF; END`); err != nil {
		t.Fatal(err)
	}
}

// wantNoEffectNotDone fails the test unless none of keys' orders counts a
// cancel and each of their tasks is still pending.
func (b *bundle) wantNoEffectNotDone(t *testing.T, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, cancels := b.orderRow(t, k); cancels != 0 {
			t.Errorf("%s: the effect was committed %d times though its task could not be marked done", k, cancels)
		}
		if info, err := outbox.Get(b.ctx, b.db, "order-cancel", k); err != nil || info.State != outbox.StatePending {
			t.Errorf("%s: task %+v, %v; want still pending", k, info, err)
		}
	}
}

// countCancel counts a run in the order's cancels, unconditionally:
// committed without its task's done mark, it would be counted again by
// every redelivery.
func countCancel(ctx context.Context, tx *sql.Tx, key string) error {
	_, err := tx.ExecContext(ctx, "UPDATE orders SET cancels = cancels + 1 WHERE id = ?", key)
	return err
}

// An effect is committed only with its task marked done: when the mark
// fails, Handle fails and commits nothing, so the redelivery runs fn again
// on a clean slate instead of applying the effect a second time.
func TestHandle_AFailedDoneMarkCommitsNoEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now())
	b.refuseDone(t)
	if _, err := outbox.Handle(b.ctx, b.db, msg, func(ctx context.Context, tx *sql.Tx) error { return countCancel(ctx, tx, "o1") }); err == nil {
		t.Error("Handle reported no error though the task could not be marked done")
	}
	b.wantNoEffectNotDone(t, "o1")
}

func TestHandleGroup_AFailedDoneMarkCommitsNoEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msgs := []*broker.Message{b.order(t, "o1", time.Now()), b.order(t, "o2", time.Now())}
	b.refuseDone(t)
	if _, _, err := outbox.HandleGroup(b.ctx, b.db, msgs, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		return countCancel(ctx, tx, m.Key)
	}); err == nil {
		t.Error("HandleGroup reported no error though its tasks could not be marked done")
	}
	b.wantNoEffectNotDone(t, "o1", "o2")
}
