package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// NewConsumer fills in what a service leaves unset: a retry is recorded on
// its task row (the attempt, when it is due again, why), so the scanner
// leaves the task alone while it waits out its backoff and MaxAttempts
// holds across a rescue; and a task that keeps failing is marked dead on
// its row, not only published to the dead topic.
func TestNewConsumer_RecordsRetriesAndDeadTasksOnTheRowByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now().Add(-time.Second)
	flaky, poison := b.order(t, "flaky", now), b.order(t, "poison", now)
	var flakyRuns atomic.Int64
	fn := func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		switch {
		case m.Key == "poison":
			return errors.New("poison pill")
		case m.Key == "flaky" && flakyRuns.Add(1) == 1:
			return errors.New("payment service down")
		}
		return cancelOne(ctx, tx, m)
	}
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	// The retry waits 3 s: long enough to read the row while it waits.
	c, err := outbox.NewConsumer(b.db, mem, mem, fn, broker.ConsumerConfig{Logger: quiet(), MaxAttempts: 2,
		Backoff: broker.Backoff{Initial: 3 * time.Second, Max: 3 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx, "order-cancel"); err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background()) //nolint:errcheck
	if err := mem.Publish(b.ctx, flaky, poison); err != nil {
		t.Fatal(err)
	}
	retry := func() (attempts int, next int64, why string) {
		if err := b.db.QueryRow("SELECT attempts, next_attempt_ms, COALESCE(last_error, '') FROM delay_task WHERE task_key = 'flaky'").Scan(&attempts, &next, &why); err != nil {
			t.Fatal(err)
		}
		return attempts, next, why
	}
	if !testutil.Eventually(15*time.Second, 10*time.Millisecond, func() bool { a, _, _ := retry(); return a > 0 }) {
		t.Fatal("the flaky task's retry was never recorded on its row")
	}
	// The done mark leaves these columns as the retry set them.
	if attempts, next, why := retry(); attempts != 1 || next < now.UnixMilli()+time.Second.Milliseconds() || !strings.Contains(why, "payment service down") {
		t.Fatalf("flaky row after its retry was recorded: attempts %d, next_attempt_ms %d (due %d), last_error %q; want attempt 1, due again seconds on, the cause",
			attempts, next, now.UnixMilli(), why)
	}
	if !testutil.Eventually(30*time.Second, 20*time.Millisecond, func() bool {
		f, err1 := outbox.Get(b.ctx, b.db, "order-cancel", "flaky")
		p, err2 := outbox.Get(b.ctx, b.db, "order-cancel", "poison")
		return err1 == nil && err2 == nil && f.State == outbox.StateDone && p.State == outbox.StateDead
	}) {
		f, _ := outbox.Get(b.ctx, b.db, "order-cancel", "flaky")
		p, _ := outbox.Get(b.ctx, b.db, "order-cancel", "poison")
		t.Fatalf("flaky %s, poison %s; want done and dead", f.State, p.State)
	}
	if st, cancels := b.orderRow(t, "flaky"); st != "CANCELLED" || cancels != 1 {
		t.Fatalf("flaky order %s after %d cancels, want CANCELLED once", st, cancels)
	}
}
