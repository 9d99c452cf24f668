package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge"
)

// orderService is the order service: an order reserves stock and schedules
// its own cancellation; paying cancels the cancellation. It is what a
// service of your own copies: every delaybridge call goes through the
// Client, inside the order's transaction.
type orderService struct {
	db      *sql.DB
	client  *delaybridge.Client
	timeout time.Duration // how long an order may stay unpaid
	channel *paymentChannel
	recheck time.Duration // how soon the timeout asks the channel again
}

// paymentChannel is the payment provider, simulated. A payment started
// there is pending until its callback has reached the order service: the
// timeout must not cancel the order meanwhile.
type paymentChannel struct {
	mu      sync.Mutex
	pending map[string]bool
}

func (c *paymentChannel) start(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending = map[string]bool{}
	}
	c.pending[id] = true
}

func (c *paymentChannel) settled(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, id)
}

// isPending is the channel's answer to "is a payment of this order in
// flight?".
func (c *paymentChannel) isPending(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending[id]
}

// The topics of this program's tasks: an order's cancellation, and the
// refund of a payment that lost the race to it.
const (
	topic       = "ordertimeout-cancel"
	refundTopic = "ordertimeout-refund"
)

// setup creates the tables if needed and stocks each sku with n units,
// replacing the data and the tasks of earlier runs.
func (s *orderService) setup(ctx context.Context, skus []string, n int) error {
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS demo_inventory (sku VARCHAR(64) NOT NULL PRIMARY KEY, available INT NOT NULL, initial INT NOT NULL) ENGINE = InnoDB`,
		`CREATE TABLE IF NOT EXISTS demo_orders (id VARCHAR(64) NOT NULL PRIMARY KEY, sku VARCHAR(64) NOT NULL, qty INT NOT NULL,
  status VARCHAR(16) NOT NULL, expire_ms BIGINT NOT NULL, paid_ms BIGINT NULL, cancelled_ms BIGINT NULL, cancelled_by VARCHAR(16) NULL,
  KEY ix_demo_orders_status_expire (status, expire_ms)) ENGINE = InnoDB`,
		`CREATE TABLE IF NOT EXISTS demo_refunds (id VARCHAR(64) NOT NULL PRIMARY KEY, refunded_ms BIGINT NOT NULL) ENGINE = InnoDB`,
		`DELETE FROM demo_orders`,
		`DELETE FROM demo_inventory`,
		`DELETE FROM demo_refunds`,
	} {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	if _, err := s.db.ExecContext(ctx, "DELETE FROM delay_task WHERE topic IN (?, ?)", topic, refundTopic); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	for _, sku := range skus {
		if _, err := s.db.ExecContext(ctx, "INSERT INTO demo_inventory (sku, available, initial) VALUES (?, ?, ?)", sku, n, n); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	return nil
}

// createOrder reserves qty of sku, writes the order UNPAID and schedules
// its cancellation at now + timeout, in one transaction: an order never
// exists without its timeout task, nor a task without its order.
func (s *orderService) createOrder(ctx context.Context, id, sku string, qty int) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	res, err := tx.ExecContext(ctx, "UPDATE demo_inventory SET available = available - ? WHERE sku = ? AND available >= ?", qty, sku, qty)
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("order %s: %s is out of stock", id, sku)
	}
	expire := time.Now().Add(s.timeout)
	if _, err := tx.ExecContext(ctx, "INSERT INTO demo_orders (id, sku, qty, status, expire_ms) VALUES (?, ?, ?, 'UNPAID', ?)",
		id, sku, qty, expire.UnixMilli()); err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	if _, err := s.client.Schedule(ctx, tx, delaybridge.Task{Topic: topic, Key: id, DueAt: expire}); err != nil {
		return err
	}
	return tx.Commit()
}

// startPayment is the customer paying: the channel takes the payment,
// and the order shows PAYING until the channel's callback (pay) arrives.
// It refuses an order whose cancel time has passed.
func (s *orderService) startPayment(ctx context.Context, id string) (bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if late, err := s.client.Overdue(ctx, tx, topic, id); err != nil || late {
		return false, err
	}
	res, err := tx.ExecContext(ctx, "UPDATE demo_orders SET status = 'PAYING' WHERE id = ? AND status = 'UNPAID'", id)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return false, nil
	}
	// The channel knows of the payment before the order says PAYING: the
	// timeout that reads PAYING then finds it pending.
	s.channel.start(id)
	return true, tx.Commit()
}

// pay is the channel's callback: the payment was captured. It marks the
// order paid and cancels its timeout task, in one transaction, locking the
// task before the order as the handler does, so pay and timeout never
// deadlock. An UNPAID order whose cancel time has passed is refused (the
// read path shows it EXPIRED already); a PAYING one was paid in time.
// A refused payment was captured all the same: its refund is scheduled,
// as a task of its own, so it happens exactly once.
func (s *orderService) pay(ctx context.Context, id string) (paid bool, err error) {
	defer func() {
		if err == nil && !paid {
			err = s.scheduleRefund(ctx, id)
		}
	}()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var status string
	if err := tx.QueryRowContext(ctx, "SELECT status FROM demo_orders WHERE id = ?", id).Scan(&status); err != nil {
		return false, err
	}
	if status == "UNPAID" {
		if late, err := s.client.Overdue(ctx, tx, topic, id); err != nil || late {
			return false, err
		}
	}
	if err := s.client.Cancel(ctx, tx, topic, id); errors.Is(err, delaybridge.ErrFinished) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, "UPDATE demo_orders SET status = 'PAID', paid_ms = ? WHERE id = ? AND status IN ('UNPAID', 'PAYING')", time.Now().UnixMilli(), id)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return false, nil
	}
	return true, tx.Commit()
}

// scheduleRefund schedules the refund of order id's captured payment,
// due at once. A second refund of the same order is the same task.
func (s *orderService) scheduleRefund(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := s.client.Schedule(ctx, tx, delaybridge.Task{Topic: refundTopic, Key: id, DueAt: time.Now()}); err != nil && !errors.Is(err, delaybridge.ErrDuplicate) {
		return err
	}
	return tx.Commit()
}

// refundTask is the refund topic's handler: it asks the channel to give
// the money back (here, it records the refund) in the transaction that
// marks the task done.
func (s *orderService) refundTask(ctx context.Context, tx *sql.Tx, m *delaybridge.Message) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO demo_refunds (id, refunded_ms) VALUES (?, ?)", m.Key, time.Now().UnixMilli())
	return err
}

// cancelOrder cancels an unpaid order and releases its stock inside tx; a
// paid or cancelled order stays as it is.
func cancelOrder(ctx context.Context, tx *sql.Tx, id, by string) error {
	var sku string
	var qty int
	err := tx.QueryRowContext(ctx, "SELECT sku, qty FROM demo_orders WHERE id = ? AND status IN ('UNPAID', 'PAYING') FOR UPDATE", id).Scan(&sku, &qty)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE demo_orders SET status = 'CANCELLED', cancelled_ms = ?, cancelled_by = ? WHERE id = ?",
		time.Now().UnixMilli(), by, id); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, "UPDATE demo_inventory SET available = available + ? WHERE sku = ?", qty, sku)
	return err
}

// cancelTask is the handler of the timeout topic. It runs in the
// transaction that marks the task done, so it happens once, and never for
// an order whose payment cancelled the task. While the channel says a
// payment is in flight it snoozes: not yet, ask again shortly.
func (s *orderService) cancelTask(ctx context.Context, tx *sql.Tx, m *delaybridge.Message) error {
	var status string
	err := tx.QueryRowContext(ctx, "SELECT status FROM demo_orders WHERE id = ? FOR UPDATE", m.Key).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if status == "PAYING" && s.channel.isPending(m.Key) {
		return delaybridge.Snooze(s.recheck, "payment pending at the channel")
	}
	by := "timeout"
	if ctx.Value(readPath{}) != nil {
		by = "read"
	}
	return cancelOrder(ctx, tx, m.Key, by)
}

// readPath marks the context of a read that runs the timeout itself.
type readPath struct{}

// unpaidPastDue is the scanner's business query: orders still unpaid more
// than grace after they expired, whatever became of their task.
func (s *orderService) unpaidPastDue(grace time.Duration) func(ctx context.Context, db *sql.DB, limit int) ([]string, error) {
	return func(ctx context.Context, db *sql.DB, limit int) ([]string, error) {
		rows, err := db.QueryContext(ctx, "SELECT id FROM demo_orders WHERE status = 'UNPAID' AND expire_ms < ? ORDER BY expire_ms LIMIT ?",
			time.Now().Add(-grace).UnixMilli(), limit)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var ids []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return nil, err
			}
			ids = append(ids, id)
		}
		return ids, rows.Err()
	}
}

// cancelIfUnpaid is the scanner's business handler: it cancels the order
// and its task in one transaction when the order is still unpaid.
func (s *orderService) cancelIfUnpaid(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := s.client.Cancel(ctx, tx, topic, id); err != nil && !errors.Is(err, delaybridge.ErrNotFound) && !errors.Is(err, delaybridge.ErrFinished) {
		return err
	}
	if err := cancelOrder(ctx, tx, id, "scanner"); err != nil {
		return err
	}
	return tx.Commit()
}

// show is the read path, GET /orders/{id}. An UNPAID order whose cancel
// time has passed is not shown as UNPAID (the lazy check): the read runs
// its timeout at once (RunNow), which cancels it and releases its stock,
// unless the broker's delivery did so first. It reports whether the read
// cancelled it.
func (s *orderService) show(ctx context.Context, id string) (string, bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", false, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var status string
	if err := tx.QueryRowContext(ctx, "SELECT status FROM demo_orders WHERE id = ?", id).Scan(&status); err != nil {
		return "", false, fmt.Errorf("show %s: %w", id, err)
	}
	if status != "UNPAID" {
		return status, false, nil
	}
	if overdue, err := s.client.Overdue(ctx, tx, topic, id); err != nil || !overdue {
		return status, false, err
	}
	ran, err := s.client.RunNow(context.WithValue(ctx, readPath{}, true), tx, topic, id)
	if err != nil {
		return "", false, err // the deferred rollback undoes the handler's writes
	}
	if ran {
		return "CANCELLED", true, tx.Commit()
	}
	// The consumer ran it meanwhile, or a payment started just in time
	// and the task waits for it: read the order again, past the snapshot.
	if err := tx.QueryRowContext(ctx, "SELECT status FROM demo_orders WHERE id = ? FOR UPDATE", id).Scan(&status); err != nil {
		return "", false, err
	}
	if err := tx.Commit(); err != nil {
		return "", false, err
	}
	if status != "UNPAID" {
		return status, false, nil
	}
	return "EXPIRED", false, nil
}

// report is what the program checks at the end.
type report struct {
	orders, paid, cancelled int
	wronglyCancelled        int // paid, yet cancelled
	leftUnpaid              int // unpaid past the cancel time
	early                   int // cancelled by the timeout before the cancel time
	refunds                 int // refunds made, each of a cancelled order
	refundedPaid            int // refunds of an order that is paid
	snoozed                 int // timeout tasks whose handler snoozed
	stockOK                 bool
	cancelledBy             map[string]int
	p50, p99, max           int64 // cancellation lateness, ms
}

// check reads the orders and the stock.
func (s *orderService) check(ctx context.Context) (*report, error) {
	r := &report{cancelledBy: map[string]int{}}
	var bad int
	for _, q := range []struct {
		dst   *int
		query string
	}{
		{&r.orders, "SELECT COUNT(*) FROM demo_orders"},
		{&r.paid, "SELECT COUNT(*) FROM demo_orders WHERE status = 'PAID'"},
		{&r.cancelled, "SELECT COUNT(*) FROM demo_orders WHERE status = 'CANCELLED'"},
		{&r.wronglyCancelled, "SELECT COUNT(*) FROM demo_orders WHERE paid_ms IS NOT NULL AND cancelled_ms IS NOT NULL"},
		{&r.early, "SELECT COUNT(*) FROM demo_orders WHERE cancelled_ms < expire_ms AND cancelled_by IN ('timeout', 'read')"},
		{&r.refunds, "SELECT COUNT(*) FROM demo_refunds"},
		{&r.refundedPaid, "SELECT COUNT(*) FROM demo_refunds f JOIN demo_orders o ON o.id = f.id WHERE o.status <> 'CANCELLED'"},
		{&r.snoozed, "SELECT COUNT(*) FROM delay_task WHERE topic = '" + topic + "' AND snoozes > 0"},
		{&bad, `SELECT COUNT(*) FROM demo_inventory i
WHERE i.initial <> i.available + (SELECT COALESCE(SUM(o.qty), 0) FROM demo_orders o WHERE o.sku = i.sku AND o.status <> 'CANCELLED')`},
	} {
		if err := s.db.QueryRowContext(ctx, q.query).Scan(q.dst); err != nil {
			return nil, err
		}
	}
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM demo_orders WHERE status = 'UNPAID' AND expire_ms < ?",
		time.Now().UnixMilli()).Scan(&r.leftUnpaid); err != nil {
		return nil, err
	}
	r.stockOK = bad == 0
	rows, err := s.db.QueryContext(ctx, "SELECT cancelled_ms - expire_ms, cancelled_by FROM demo_orders WHERE status = 'CANCELLED'")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var late []int64
	for rows.Next() {
		var l int64
		var by string
		if err := rows.Scan(&l, &by); err != nil {
			return nil, err
		}
		late = append(late, l)
		r.cancelledBy[by]++
	}
	if len(late) > 0 {
		slices.Sort(late)
		at := func(q float64) int64 { return late[int(q*float64(len(late)-1))] }
		r.p50, r.p99, r.max = at(0.50), at(0.99), late[len(late)-1]
	}
	return r, rows.Err()
}

// waitSettled polls check until every order is paid or cancelled and
// refunds are made, or deadline passes, or ctx ends.
func (s *orderService) waitSettled(ctx context.Context, deadline time.Time, refunds int) error {
	for {
		r, err := s.check(ctx)
		if err != nil {
			return err
		}
		if (r.paid+r.cancelled == r.orders && r.refunds >= refunds) || time.Now().After(deadline) || ctx.Err() != nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}
