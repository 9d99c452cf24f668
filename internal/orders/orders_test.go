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
	cancelHandler, refundHandler := svc.CancelHandler(), outbox.BrokerHandler(db, svc.RefundTask)
	var settledMu sync.Mutex
	settled := map[string]int{}
	c, err := broker.NewConsumer(mem, mem, func(ctx context.Context, m *broker.Message) error {
		if m.Topic == orders.RefundTopic {
			return refundHandler(ctx, m)
		}
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
	if err := c.Start(ctx, orders.Topic, orders.RefundTopic); err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background()) //nolint:errcheck

	const n = 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	paid, refused := 0, 0
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
				mu.Lock()
				defer mu.Unlock()
				if ok {
					paid++
				} else if err == nil {
					refused++
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
		if (r.Paid+r.Cancelled == n && r.Refunds >= refused) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.Paid != paid || r.Paid+r.Cancelled != n || r.WronglyCancelled != 0 || r.LeftUnpaid != 0 || !r.StockOK || r.Early != 0 ||
		r.Refunds != refused || r.RefundedPaid != 0 {
		t.Fatalf("report %+v (payments that went through: %d, refused: %d)", r, paid, refused)
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
	t.Logf("%d paid, %d of them after their message was published; %d refused and refunded", paid, reached, refused)
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
	if got := refundTasks(t, db); len(got) != 1 || got[0] != "late" {
		t.Fatalf("refund tasks %v, want one, of the late order", got)
	}
}

// setup returns a service on a scratch database whose orders expire after
// timeout, with a payment channel and 10 units of "sku".
func setup(t *testing.T, timeout time.Duration) *orders.Service {
	t.Helper()
	db, _ := testenv.ScratchDB(t)
	if _, err := outbox.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	svc := &orders.Service{DB: db, Timeout: timeout, Channel: &orders.Channel{}}
	if err := svc.Setup(context.Background(), []string{"sku"}, 10); err != nil {
		t.Fatal(err)
	}
	return svc
}

// waitOverdue waits until the timeout task of each order is due.
func waitOverdue(t *testing.T, db *sql.DB, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if !testutil.Eventually(30*time.Second, 20*time.Millisecond, func() bool {
			late, err := outbox.Overdue(context.Background(), db, orders.Topic, id)
			return err == nil && late
		}) {
			t.Fatalf("the task of %s never came due", id)
		}
	}
}

// message is the message of id's task on topic as the relay publishes it
// now.
func message(t *testing.T, db *sql.DB, topic, id string) *broker.Message {
	t.Helper()
	info, err := outbox.Get(context.Background(), db, topic, id)
	if err != nil {
		t.Fatal(err)
	}
	return &broker.Message{TaskID: info.ID, Topic: topic, Key: id, Generation: info.Generation, DeliverAt: info.Task.DueAt}
}

// deliver hands m to fn as the consumer does, through outbox.Handle.
func deliver(t *testing.T, db *sql.DB, m *broker.Message, fn outbox.HandlerFunc) outbox.HandleResult {
	t.Helper()
	o, err := outbox.Handle(context.Background(), db, m, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, tx, m) })
	if err != nil {
		t.Fatalf("delivery of %s/%s: %v", m.Topic, m.Key, err)
	}
	return o
}

// status is the order's status column.
func status(t *testing.T, db *sql.DB, id string) string {
	t.Helper()
	var s string
	if err := db.QueryRow("SELECT status FROM demo_orders WHERE id = ?", id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// refundTasks lists the keys of the refund tasks.
func refundTasks(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query("SELECT task_key FROM delay_task WHERE topic = ? ORDER BY task_key", orders.RefundTopic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// A payment started in time holds its order past the cancel time: the
// timeout snoozes while the channel says pending, the scanner leaves it,
// and the callback pays it. A payment the channel no longer has pending
// holds nothing: the timeout cancels its order.
func TestOrders_TimeoutSnoozesWhileThePaymentIsPendingAtTheChannel(t *testing.T) {
	t.Parallel()
	svc := setup(t, 2*time.Second)
	svc.Recheck = time.Hour // the snoozed task stays put for the test
	ctx, db := context.Background(), svc.DB
	for _, id := range []string{"pending", "abandoned", "callback"} {
		if err := svc.CreateOrder(ctx, id, "sku", 2); err != nil {
			t.Fatal(err)
		}
		if ok, err := svc.StartPayment(ctx, id); err != nil || !ok {
			t.Fatalf("StartPayment %s = %v, %v; want it started", id, ok, err)
		}
	}
	svc.Channel.Settle("abandoned") // the payment failed at the channel
	waitOverdue(t, db, "pending", "abandoned", "callback")

	if ok, err := svc.Pay(ctx, "callback"); err != nil || !ok {
		t.Fatalf("callback of a payment started in time, after the cancel time = %v, %v; want it paid", ok, err)
	}
	if o := deliver(t, db, message(t, db, orders.Topic, "pending"), svc.CancelTask); o != outbox.Snoozed {
		t.Fatalf("timeout of an order whose payment is pending: %v, want snoozed", o)
	}
	info, err := outbox.Get(ctx, db, orders.Topic, "pending")
	if err != nil {
		t.Fatal(err)
	}
	if info.State != outbox.StatePending || info.Snoozes != 1 || info.Task.DueAt.Before(time.Now().Add(30*time.Minute)) {
		t.Fatalf("snoozed task is %s, %d snoozes, due %v; want pending, 1, in about Recheck", info.State, info.Snoozes, info.Task.DueAt)
	}
	if err := svc.CancelIfUnpaid(ctx, "pending"); err != nil {
		t.Fatal(err)
	}
	if s := status(t, db, "pending"); s != "PAYING" {
		t.Fatalf("order with a pending payment is %s after its timeout and the scanner, want PAYING", s)
	}
	if info, err := outbox.Get(ctx, db, orders.Topic, "pending"); err != nil || info.State != outbox.StatePending {
		t.Fatalf("after the scanner the task is %v (%v), want pending", info.State, err)
	}
	if o := deliver(t, db, message(t, db, orders.Topic, "abandoned"), svc.CancelTask); o != outbox.Handled {
		t.Fatalf("timeout of an order whose payment failed: %v, want handled", o)
	}
	if s := status(t, db, "abandoned"); s != "CANCELLED" {
		t.Fatalf("order whose payment failed is %s after its timeout, want CANCELLED", s)
	}

	if ok, err := svc.Pay(ctx, "pending"); err != nil || !ok {
		t.Fatalf("callback after the snooze = %v, %v; want it paid", ok, err)
	}
	svc.Channel.Settle("pending")
	r, err := svc.Check(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Paid != 2 || r.Cancelled != 1 || r.WronglyCancelled != 0 || r.Snoozed != 1 || !r.StockOK || len(refundTasks(t, db)) != 0 {
		t.Fatalf("report %+v, refund tasks %v", r, refundTasks(t, db))
	}
}

// The channel reports a captured payment after the timeout cancelled the
// order, twice (a callback may come again): the payment is refused and
// refunded by one task, whose one delivery makes one refund. A payment in
// time is never refunded.
func TestOrders_LatePaymentAfterTheCancellationIsRefundedOnce(t *testing.T) {
	t.Parallel()
	svc := setup(t, 2*time.Second)
	ctx, db := context.Background(), svc.DB
	for _, id := range []string{"in-time", "late"} {
		if err := svc.CreateOrder(ctx, id, "sku", 1); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := svc.Pay(ctx, "in-time"); err != nil || !ok {
		t.Fatalf("Pay before the cancel time = %v, %v; want it paid", ok, err)
	}
	waitOverdue(t, db, "late")
	if o := deliver(t, db, message(t, db, orders.Topic, "late"), svc.CancelTask); o != outbox.Handled || status(t, db, "late") != "CANCELLED" {
		t.Fatalf("timeout of the late order: %v, order %s; want it cancelled", o, status(t, db, "late"))
	}
	for range 2 {
		if ok, err := svc.Pay(ctx, "late"); err != nil || ok {
			t.Fatalf("Pay of a cancelled order = %v, %v; want it refused", ok, err)
		}
	}
	if got := refundTasks(t, db); len(got) != 1 || got[0] != "late" {
		t.Fatalf("refund tasks %v, want one, of the late order", got)
	}
	m := message(t, db, orders.RefundTopic, "late")
	for i, want := range []outbox.HandleResult{outbox.Handled, outbox.SkippedDone} {
		if o := deliver(t, db, m, svc.RefundTask); o != want {
			t.Fatalf("refund delivery %d: %v, want %v", i+1, o, want)
		}
	}
	r, err := svc.Check(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Refunds != 1 || r.RefundedPaid != 0 || r.Paid != 1 || r.Cancelled != 1 || !r.StockOK {
		t.Fatalf("report %+v", r)
	}
}

// A read of an order past its cancel time cancels it there and then,
// releasing its stock, and the delivery of its timeout that follows is
// skipped. A read before the cancel time shows the order as it is.
func TestOrders_ReadCancelsAnExpiredOrderAtOnceAndTheDeliveryIsSkipped(t *testing.T) {
	t.Parallel()
	svc := setup(t, time.Second)
	ctx, db := context.Background(), svc.DB
	if err := svc.CreateOrder(ctx, "expired", "sku", 3); err != nil {
		t.Fatal(err)
	}
	m := message(t, db, orders.Topic, "expired") // on its way through the broker
	svc.Timeout = time.Hour
	if err := svc.CreateOrder(ctx, "fresh", "sku", 2); err != nil {
		t.Fatal(err)
	}
	waitOverdue(t, db, "expired")

	if s, cancelled, err := svc.Show(ctx, "fresh"); err != nil || s != "UNPAID" || cancelled {
		t.Fatalf("Show before the cancel time = %q, %v, %v; want UNPAID", s, cancelled, err)
	}
	if s, cancelled, err := svc.Show(ctx, "expired"); err != nil || s != "CANCELLED" || !cancelled {
		t.Fatalf("Show after the cancel time = %q, %v, %v; want CANCELLED by the read", s, cancelled, err)
	}
	var available int
	if err := db.QueryRow("SELECT available FROM demo_inventory WHERE sku = 'sku'").Scan(&available); err != nil || available != 8 {
		t.Fatalf("available after the read = %d (%v); want 8, the expired order's 3 back", available, err)
	}
	if s, cancelled, err := svc.Show(ctx, "expired"); err != nil || s != "CANCELLED" || cancelled {
		t.Fatalf("second Show = %q, %v, %v; want CANCELLED, not by this read", s, cancelled, err)
	}
	if o := deliver(t, db, m, svc.CancelTask); o != outbox.SkippedDone {
		t.Fatalf("delivery after the read: %v, want skipped as done", o)
	}
	r, err := svc.Check(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Cancelled != 1 || r.CancelledBy["read"] != 1 || r.Early != 0 || !r.StockOK {
		t.Fatalf("report %+v", r)
	}
}
