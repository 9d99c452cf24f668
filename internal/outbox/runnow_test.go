package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// runNow runs the order's cancel through RunNow in a transaction of its
// own and commits it; it reports whether the handler ran.
func (b *bundle) runNow(t *testing.T, key string, fn outbox.HandlerFunc) (bool, error) {
	t.Helper()
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	ran, err := outbox.RunNow(b.ctx, tx, "order-cancel", key, fn)
	if err != nil {
		return ran, err
	}
	return ran, tx.Commit()
}

func cancelNow(id string) outbox.HandlerFunc {
	return func(ctx context.Context, tx *sql.Tx, _ *broker.Message) error { return cancelOrder(id)(ctx, tx) }
}

// RunNow runs a due, unfinished task in the caller's transaction with the
// message a delivery would carry, and marks it done there; it leaves
// every other task as it is and says so.
func TestRunNow_RunsOnlyADueUnfinishedTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	past := time.Now().Add(-time.Second)
	b.order(t, "due", past)
	b.order(t, "later", time.Now().Add(time.Hour))
	for key, set := range map[string]string{"done": "done", "cancelled": "cancelled", "dead": "dead"} {
		b.order(t, key, past)
		if _, err := b.db.Exec("UPDATE delay_task SET state = ? WHERE task_key = ?", set, key); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.db.Exec("UPDATE delay_task SET headers = '{\"tenant\":\"eu\"}', payload = 'p', generation = 3 WHERE task_key = 'due'"); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"later", "done", "cancelled", "dead", "no-such-order"} {
		calls := 0
		ran, err := b.runNow(t, key, func(context.Context, *sql.Tx, *broker.Message) error { calls++; return nil })
		if ran || err != nil || calls != 0 {
			t.Errorf("%s: ran %v, err %v, handler called %d times; want nothing run", key, ran, err, calls)
		}
	}
	if status, _ := b.orderRow(t, "later"); status != "UNPAID" {
		t.Errorf("later: order %s", status)
	}
	var got *broker.Message
	ran, err := b.runNow(t, "due", func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		got = m
		return cancelOrder("due")(ctx, tx)
	})
	if !ran || err != nil {
		t.Fatalf("due: ran %v, %v", ran, err)
	}
	if got.TaskID == 0 || got.Topic != "order-cancel" || got.Key != "due" || string(got.Payload) != "p" || got.Headers["tenant"] != "eu" ||
		got.Generation != 3 || !got.DeliverAt.Equal(time.UnixMilli(broker.DueMillis(past))) {
		t.Errorf("the handler got %+v", got)
	}
	if info, err := outbox.Get(b.ctx, b.db, "order-cancel", "due"); err != nil || info.State != outbox.StateDone {
		t.Errorf("due after RunNow: %+v, %v", info, err)
	}
	if status, cancels := b.orderRow(t, "due"); status != "CANCELLED" || cancels != 1 {
		t.Errorf("due: order %s, cancelled %d times", status, cancels)
	}
	// A second RunNow, and the broker's delivery after it, find it done.
	if ran, err := b.runNow(t, "due", cancelNow("due")); ran || err != nil {
		t.Errorf("second RunNow: ran %v, %v", ran, err)
	}
}

// A handler that fails leaves the task to its delivery: the caller rolls
// back, and nothing of the run is kept.
func TestRunNow_AFailedHandlerChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o", time.Now().Add(-time.Second))
	boom := errors.New("payment channel down")
	ran, err := b.runNow(t, "o", func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		if err := cancelOrder("o")(ctx, tx); err != nil {
			return err
		}
		return boom
	})
	if ran || !errors.Is(err, boom) {
		t.Fatalf("ran %v, err %v; want the handler's error", ran, err)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", "o"); info.State != outbox.StatePending {
		t.Errorf("task %s after a failed RunNow, want pending", info.State)
	}
	if status, _ := b.orderRow(t, "o"); status != "UNPAID" {
		t.Errorf("order %s after a failed RunNow, want UNPAID", status)
	}
	if _, err := outbox.RunNow(b.ctx, nil, "order-cancel", "o", cancelNow("o")); err == nil {
		t.Error("RunNow with no transaction: no error")
	}
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := outbox.RunNow(b.ctx, tx, "order-cancel", "", cancelNow("o")); err == nil {
		t.Error("RunNow with an empty key: no error")
	}
}

// The read path's RunNow and the consumer's Handle race for the same due
// task, round after round: the cancel happens exactly once, whichever
// wins, and the task ends done.
func TestRunNow_RacesTheConsumerAndTheEffectHappensOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rounds = 150
	nowWins := 0
	for i := range rounds {
		id := fmt.Sprintf("race-%d", i)
		msg := b.order(t, id, time.Now().Add(-time.Millisecond))
		var wg sync.WaitGroup
		var ran bool
		var outcome outbox.HandleResult
		var nowErr, handleErr error
		wg.Add(2)
		go func() { defer wg.Done(); ran, nowErr = b.runNow(t, id, cancelNow(id)) }()
		go func() {
			defer wg.Done()
			outcome, handleErr = outbox.Handle(b.ctx, b.db, msg, cancelOrder(id))
		}()
		wg.Wait()
		if nowErr != nil || handleErr != nil {
			t.Fatalf("round %d: RunNow %v, Handle %v", i, nowErr, handleErr)
		}
		if ran == (outcome == outbox.Handled) {
			t.Fatalf("round %d: RunNow ran %v and Handle %v: want exactly one of them to run", i, ran, outcome)
		}
		if ran {
			nowWins++
		}
		if status, cancels := b.orderRow(t, id); status != "CANCELLED" || cancels != 1 {
			t.Fatalf("round %d: order %s, cancelled %d times; want once", i, status, cancels)
		}
	}
	t.Logf("RunNow won %d of %d rounds", nowWins, rounds)
}
