package orders_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/orders"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

func TestOrderTimeout_UnpaidOrdersCancelPaidOnesStay(t *testing.T) {
	db, _ := testenv.ScratchDB(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	mem := memory.New(memory.Config{Limits: broker.Limits{Precision: 50 * time.Millisecond}, Early: 40 * time.Millisecond})
	defer mem.Close()
	relay, err := outbox.NewRelay(db, mem, outbox.RelayConfig{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	svc := &orders.Service{DB: db, Timeout: 800 * time.Millisecond, Nudge: relay.Nudge}
	if err := svc.Setup(ctx, []string{"sku-1", "sku-2"}, 1000); err != nil {
		t.Fatal(err)
	}
	go func() { _ = relay.Run(ctx) }()
	// Count the deliveries the cancel handler settled, so the test can wait
	// for the messages of paid orders too: those are the ones Handle skips.
	cancelHandler := svc.CancelHandler()
	var settledMu sync.Mutex
	settled := map[string]int{}
	c, err := broker.NewConsumer(mem, mem, func(ctx context.Context, m *broker.Message) error {
		err := cancelHandler(ctx, m)
		if err == nil || errors.Is(err, broker.ErrSkipped) {
			settledMu.Lock()
			settled[m.Key]++
			settledMu.Unlock()
		}
		return err
	}, broker.ConsumerConfig{Logger: log, DeadLetter: outbox.DeadLetter(db, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, orders.Topic); err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background()) //nolint:errcheck

	const n = 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	paid := 0
	for i := range n {
		id := fmt.Sprintf("order-%d", i)
		if err := svc.CreateOrder(ctx, id, fmt.Sprintf("sku-%d", 1+i%2), 1+i%3); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Pay anywhere from at once to a little after the timeout.
				time.Sleep(time.Duration(rand.IntN(1000)) * time.Millisecond)
				ok, err := svc.Pay(ctx, id)
				if err != nil {
					t.Error(err)
				}
				if ok {
					mu.Lock()
					paid++
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	deadline := time.Now().Add(20 * time.Second)
	var r *orders.Report
	for {
		if r, err = svc.Check(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if r.Paid+r.Cancelled == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.Paid != paid || r.Paid+r.Cancelled != n || r.WronglyCancelled != 0 || r.LeftUnpaid != 0 || !r.StockOK || r.Early != 0 {
		t.Fatalf("report %+v (payments that went through: %d)", r, paid)
	}
	// The handler only cancels unpaid orders, so the report above holds
	// even when Handle runs it for a cancelled task. The task's state does
	// not: a payment cancels the task, and that task must never end done.
	reached := 0 // paid orders whose message reached the handler after the payment
	for i := range n {
		id := fmt.Sprintf("order-%d", i)
		info := settledTask(t, db, id, func() bool { settledMu.Lock(); defer settledMu.Unlock(); return settled[id] > 0 }, deadline)
		var status string
		if err := db.QueryRow("SELECT status FROM demo_orders WHERE id = ?", id).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if want := map[string]outbox.State{"PAID": outbox.StateCancelled, "CANCELLED": outbox.StateDone}[status]; info.State != want {
			t.Errorf("%s is %s but its task is %s, want %s", id, status, info.State, want)
		}
		if status == "PAID" && !info.PublishedAt.IsZero() {
			reached++
		}
	}
	if reached == 0 {
		t.Fatal("no message of a paid order reached the handler: the pay/timeout race did not happen")
	}
	t.Logf("%d paid, %d of them after their message was published", paid, reached)
}

// settledTask waits until the task of order id is either unpublished or
// its message was settled by the consumer (arrived reports that), then
// returns the task as it is then.
func settledTask(t *testing.T, db *sql.DB, id string, arrived func() bool, deadline time.Time) *outbox.TaskInfo {
	t.Helper()
	for {
		// arrived before Get: the state read is the one Handle committed.
		done := arrived()
		info, err := outbox.Get(context.Background(), db, orders.Topic, id)
		if err != nil {
			t.Fatalf("%s: Get: %v", id, err)
		}
		if done || info.PublishedAt.IsZero() {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: its task was published but the message never reached the handler", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestOrderTimeout_ScannerBusinessSourceCancelsOrdersWithoutATask(t *testing.T) {
	db, _ := testenv.ScratchDB(t)
	ctx := context.Background()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	svc := &orders.Service{DB: db, Timeout: time.Millisecond}
	if err := svc.Setup(ctx, []string{"sku"}, 10); err != nil {
		t.Fatal(err)
	}
	if err := svc.CreateOrder(ctx, "lost-task", "sku", 4); err != nil {
		t.Fatal(err)
	}
	// The task vanishes (a bad manual delete); only the order is left.
	if _, err := db.Exec("DELETE FROM delay_task"); err != nil {
		t.Fatal(err)
	}
	mem := memory.New(memory.Config{})
	defer mem.Close()
	sc, err := scanner.New(db, mem, scanner.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Business: &scanner.Business{Name: "unpaid-orders", Query: svc.UnpaidPastDue(0), Handle: svc.CancelIfUnpaid}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if n, err := sc.RunBusiness(ctx); n != 1 || err != nil {
		t.Fatalf("RunBusiness = %d, %v", n, err)
	}
	r, err := svc.Check(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Cancelled != 1 || !r.StockOK || r.CancelledBy["scanner"] != 1 {
		t.Fatalf("report %+v", r)
	}
}

// A payment after the cancel time is refused even when the cancellation
// has not run yet (no consumer here): the lazy check shows the order
// expired from its cancel time on, and a payment must not revive it. One
// in time goes through.
func TestPay_RefusesAPaymentAfterTheCancelTime(t *testing.T) {
	db, _ := testenv.ScratchDB(t)
	ctx := context.Background()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	// The in-time payment must land within the timeout of the orders'
	// creation, slow commits included; the late one waits the timeout out.
	svc := &orders.Service{DB: db, Timeout: 5 * time.Second}
	if err := svc.Setup(ctx, []string{"sku"}, 10); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"in-time", "late"} {
		if err := svc.CreateOrder(ctx, id, "sku", 1); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := svc.Pay(ctx, "in-time"); err != nil || !ok {
		t.Fatalf("Pay before the cancel time = %v, %v; want it paid", ok, err)
	}
	if !testutil.Eventually(30*time.Second, 20*time.Millisecond, func() bool {
		late, err := outbox.Overdue(ctx, db, orders.Topic, "late")
		return err == nil && late
	}) {
		t.Fatal("the late order's task never came due")
	}
	if ok, err := svc.Pay(ctx, "late"); err != nil || ok {
		t.Fatalf("Pay after the cancel time = %v, %v; want it refused", ok, err)
	}
	var status string
	if err := db.QueryRow("SELECT status FROM demo_orders WHERE id = 'late'").Scan(&status); err != nil || status != "UNPAID" {
		t.Fatalf("the late order is %q (%v); want it left UNPAID for its cancellation", status, err)
	}
}
