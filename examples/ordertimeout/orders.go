package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
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
}

// setup creates the tables if needed and stocks each sku with n units,
// replacing the data and the tasks of earlier runs.
func (s *orderService) setup(ctx context.Context, skus []string, n int) error {
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS demo_inventory (sku VARCHAR(64) NOT NULL PRIMARY KEY, available INT NOT NULL, initial INT NOT NULL) ENGINE = InnoDB`,
		`CREATE TABLE IF NOT EXISTS demo_orders (id VARCHAR(64) NOT NULL PRIMARY KEY, sku VARCHAR(64) NOT NULL, qty INT NOT NULL,
  status VARCHAR(16) NOT NULL, expire_ms BIGINT NOT NULL, paid_ms BIGINT NULL, cancelled_ms BIGINT NULL, cancelled_by VARCHAR(16) NULL,
  KEY ix_demo_orders_status_expire (status, expire_ms)) ENGINE = InnoDB`,
		`DELETE FROM demo_orders`,
		`DELETE FROM demo_inventory`,
	} {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	if _, err := s.db.ExecContext(ctx, "DELETE FROM delay_task WHERE topic = ?", topic); err != nil {
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

// pay marks an unpaid order paid and cancels its timeout task, in one
// transaction, locking the task before the order as the handler does, so
// pay and timeout never deadlock. It reports false when the timeout won
// the race or the cancel time has passed: the read path shows such an
// order EXPIRED already, so a payment must not revive it.
func (s *orderService) pay(ctx context.Context, id string) (bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if late, err := s.client.Overdue(ctx, tx, topic, id); err != nil || late {
		return false, err
	}
	if err := s.client.Cancel(ctx, tx, topic, id); errors.Is(err, delaybridge.ErrFinished) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, "UPDATE demo_orders SET status = 'PAID', paid_ms = ? WHERE id = ? AND status = 'UNPAID'", time.Now().UnixMilli(), id)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return false, nil
	}
	return true, tx.Commit()
}

// cancelOrder cancels an unpaid order and releases its stock inside tx; a
// paid or cancelled order stays as it is.
func cancelOrder(ctx context.Context, tx *sql.Tx, id, by string) error {
	var sku string
	var qty int
	err := tx.QueryRowContext(ctx, "SELECT sku, qty FROM demo_orders WHERE id = ? AND status = 'UNPAID' FOR UPDATE", id).Scan(&sku, &qty)
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
// an order whose payment cancelled the task.
func (s *orderService) cancelTask(ctx context.Context, tx *sql.Tx, m *delaybridge.Message) error {
	return cancelOrder(ctx, tx, m.Key, "timeout")
}

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

// show is the read path, GET /orders/{id}: an UNPAID order whose cancel
// time has passed shows as EXPIRED before its handler runs (the lazy
// check). Both reads share one read-only transaction, one snapshot.
func (s *orderService) show(ctx context.Context, id string) (string, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return "", err
	}
	defer tx.Rollback() //nolint:errcheck // read-only: nothing to keep
	var status string
	if err := tx.QueryRowContext(ctx, "SELECT status FROM demo_orders WHERE id = ?", id).Scan(&status); err != nil {
		return "", fmt.Errorf("show %s: %w", id, err)
	}
	if status != "UNPAID" {
		return status, nil
	}
	if overdue, err := s.client.Overdue(ctx, tx, topic, id); err != nil || !overdue {
		return status, err
	}
	return "EXPIRED", nil
}

// report is what the program checks at the end.
type report struct {
	orders, paid, cancelled int
	wronglyCancelled        int // paid, yet cancelled
	leftUnpaid              int // unpaid past the cancel time
	early                   int // cancelled by the timeout before the cancel time
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
		{&r.early, "SELECT COUNT(*) FROM demo_orders WHERE cancelled_ms < expire_ms AND cancelled_by = 'timeout'"},
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

// waitSettled polls check until every order is paid or cancelled, or
// deadline passes, or ctx ends.
func (s *orderService) waitSettled(ctx context.Context, deadline time.Time) error {
	for {
		r, err := s.check(ctx)
		if err != nil {
			return err
		}
		if r.paid+r.cancelled == r.orders || time.Now().After(deadline) || ctx.Err() != nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}
