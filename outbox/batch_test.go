package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/outbox"
)

// cancelOrders cancels every live order of a batch in one statement.
func cancelOrders(ctx context.Context, tx *sql.Tx, live []*broker.Message) error {
	ids := make([]any, len(live))
	for i, m := range live {
		ids[i] = m.Key
	}
	_, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'CANCELLED', cancels = cancels + 1 WHERE status = 'UNPAID' AND id IN (?"+strings.Repeat(",?", len(ids)-1)+")", ids...)
	return err
}

func TestHandleBatch_RunsLiveTasksOnceAndReportsTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live1 := b.order(t, "live-1", time.Now())
	live2 := b.order(t, "live-2", time.Now())
	done := b.order(t, "done", time.Now())
	if _, err := outbox.Handle(b.ctx, b.db, done, cancelOrder("done")); err != nil {
		t.Fatal(err)
	}
	cancelled := b.order(t, "cancelled", time.Now())
	if err := outbox.Cancel(b.ctx, b.db, "order-cancel", "cancelled"); err != nil {
		t.Fatal(err)
	}
	stale := b.order(t, "stale", time.Now())
	if err := outbox.Reschedule(b.ctx, b.db, "order-cancel", "stale", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	missing := &broker.Message{TaskID: 999999, Topic: "order-cancel", Key: "missing", DeliverAt: time.Now()}
	dup := *live1
	var got []string
	out, err := outbox.HandleBatch(b.ctx, b.db, []*broker.Message{live1, done, cancelled, stale, missing, &dup, live2},
		func(ctx context.Context, tx *sql.Tx, live []*broker.Message) error {
			for _, m := range live {
				got = append(got, m.Key)
			}
			return cancelOrders(ctx, tx, live)
		})
	if err != nil {
		t.Fatal(err)
	}
	want := []outbox.Outcome{outbox.Handled, outbox.SkippedDone, outbox.SkippedCancelled, outbox.SkippedStale, outbox.SkippedMissing, outbox.SkippedDone, outbox.Handled}
	for i := range want {
		if out[i] != want[i] {
			t.Errorf("outcome %d = %v, want %v", i, out[i], want[i])
		}
	}
	if strings.Join(got, ",") != "live-1,live-2" {
		t.Fatalf("fn saw %v, want the two live tasks once each", got)
	}
	for _, id := range []string{"live-1", "live-2"} {
		if status, cancels := b.orderRow(t, id); status != "CANCELLED" || cancels != 1 {
			t.Errorf("%s: %s with %d cancels", id, status, cancels)
		}
		if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", id); info.State != outbox.StateDone {
			t.Errorf("%s task is %s", id, info.State)
		}
	}
}

func TestHandleBatch_FailureCommitsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m1, m2 := b.order(t, "a", time.Now()), b.order(t, "b", time.Now())
	boom := errors.New("boom")
	if _, err := outbox.HandleBatch(b.ctx, b.db, []*broker.Message{m1, m2}, func(ctx context.Context, tx *sql.Tx, live []*broker.Message) error {
		if err := cancelOrders(ctx, tx, live); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("HandleBatch = %v", err)
	}
	if n := b.count(t, "state = 'done'"); n != 0 {
		t.Fatalf("%d tasks done after a failed batch", n)
	}
	if status, _ := b.orderRow(t, "a"); status != "UNPAID" {
		t.Fatalf("order a is %s", status)
	}
	if _, err := outbox.HandleBatch(b.ctx, b.db, []*broker.Message{{Topic: "t", Key: "k"}}, nil); err == nil {
		t.Fatal("a message without TaskID was accepted")
	}
}

func TestBatchConsumer_CommitsManyTasksPerTransactionExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{Prefetch: 500})
	t.Cleanup(func() { _ = mem.Close() })
	const n = 400
	due := time.Now().Add(500 * time.Millisecond)
	for i := range n {
		b.order(t, fmt.Sprintf("bc-%d", i), due)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	go func() { _ = newRelay(t, b, mem, outbox.RelayConfig{}).Run(ctx) }()
	var mu sync.Mutex
	batches, largest := 0, 0
	c, err := broker.NewConsumer(mem, mem, outbox.Handler(b.db, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		return cancelOrder(m.Key)(ctx, tx)
	}), broker.ConsumerConfig{Logger: quiet(), Concurrency: 4, Batch: outbox.BatchHandler(b.db, func(ctx context.Context, tx *sql.Tx, live []*broker.Message) error {
		mu.Lock()
		batches++
		largest = max(largest, len(live))
		mu.Unlock()
		return cancelOrders(ctx, tx, live)
	})})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, "order-cancel"); err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background()) //nolint:errcheck
	deadline := time.Now().Add(20 * time.Second)
	for b.count(t, "state = 'done'") < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d done", b.count(t, "state = 'done'"), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var once int
	if err := b.db.QueryRow("SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED' AND cancels = 1").Scan(&once); err != nil || once != n {
		t.Fatalf("%d orders cancelled once (%v), want %d", once, err, n)
	}
	mu.Lock()
	defer mu.Unlock()
	if batches == 0 || largest < 2 {
		t.Fatalf("%d batches, largest %d: the batch handler was not used for a burst", batches, largest)
	}
	t.Logf("%d tasks in %d batches, largest %d", n, batches, largest)
}
