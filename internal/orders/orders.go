package orders

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/percentile"
)

// Topic is where order cancellations travel.
const Topic = "order-cancel"

// ErrOutOfStock means an order asked for more than is available.
var ErrOutOfStock = errors.New("ordertimeout: out of stock")

// Service is the order service: orders reserve stock and schedule their own
// cancellation; paying cancels the cancellation.
type Service struct {
	DB *sql.DB
	// Timeout is how long an order may stay unpaid.
	Timeout time.Duration
	// Topic is the cancellation topic. Default Topic.
	Topic string
	// Nudge, when set, is called after an order commits (Relay.Nudge).
	Nudge func()
}

func (s *Service) topic() string {
	if s.Topic == "" {
		return Topic
	}
	return s.Topic
}

// Setup creates the tables if needed and stocks each sku with n units,
// replacing earlier demo data.
func (s *Service) Setup(ctx context.Context, skus []string, n int) error {
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS demo_inventory (sku VARCHAR(64) NOT NULL PRIMARY KEY, available INT NOT NULL, initial INT NOT NULL) ENGINE = InnoDB`,
		`CREATE TABLE IF NOT EXISTS demo_orders (id VARCHAR(64) NOT NULL PRIMARY KEY, sku VARCHAR(64) NOT NULL, qty INT NOT NULL,
  status VARCHAR(16) NOT NULL, expire_ms BIGINT NOT NULL, paid_ms BIGINT NULL, cancelled_ms BIGINT NULL, cancelled_by VARCHAR(16) NULL,
  KEY ix_demo_orders_status_expire (status, expire_ms)) ENGINE = InnoDB`,
		`DELETE FROM demo_orders`,
		`DELETE FROM demo_inventory`,
	} {
		if _, err := s.DB.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("ordertimeout: setup: %w", err)
		}
	}
	if _, err := s.DB.ExecContext(ctx, "DELETE FROM delay_task WHERE topic = ?", s.topic()); err != nil {
		return fmt.Errorf("ordertimeout: setup: %w", err)
	}
	for _, sku := range skus {
		if _, err := s.DB.ExecContext(ctx, "INSERT INTO demo_inventory (sku, available, initial) VALUES (?, ?, ?)", sku, n, n); err != nil {
			return fmt.Errorf("ordertimeout: setup: %w", err)
		}
	}
	return nil
}

// CreateOrder reserves qty of sku, writes the order UNPAID and schedules its
// cancellation at now + Timeout, all in one transaction: an order never
// exists without its timeout task, nor a task without its order.
func (s *Service) CreateOrder(ctx context.Context, id, sku string, qty int) error {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	res, err := tx.ExecContext(ctx, "UPDATE demo_inventory SET available = available - ? WHERE sku = ? AND available >= ?", qty, sku, qty)
	if err != nil {
		return fmt.Errorf("ordertimeout: reserve: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("%w: %s", ErrOutOfStock, sku)
	}
	expire := time.Now().Add(s.Timeout)
	if _, err := tx.ExecContext(ctx, "INSERT INTO demo_orders (id, sku, qty, status, expire_ms) VALUES (?, ?, ?, 'UNPAID', ?)",
		id, sku, qty, expire.UnixMilli()); err != nil {
		return fmt.Errorf("ordertimeout: insert order: %w", err)
	}
	if _, err := outbox.Schedule(ctx, tx, outbox.Task{Topic: s.topic(), Key: id, DueAt: expire}); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	if s.Nudge != nil {
		s.Nudge()
	}
	return nil
}

// Pay marks an unpaid order paid and cancels its timeout task, in one
// transaction. It takes the task's lock before the order's, the order Handle
// takes them in, so pay and timeout never deadlock. It reports false when
// the timeout won the race (the order is already cancelled) or the cancel
// time has passed: the lazy check shows such an order EXPIRED already, so a
// payment must not revive it, even before the cancellation ran
// (outbox.Cancel alone lets a payment win until the handler commits).
func (s *Service) Pay(ctx context.Context, id string) (bool, error) {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if late, err := outbox.Overdue(ctx, tx, s.topic(), id); err != nil || late {
		return false, err
	}
	if err := outbox.Cancel(ctx, tx, s.topic(), id); errors.Is(err, outbox.ErrFinished) {
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

// cancel cancels an unpaid order and releases its stock inside tx. It is a
// no-op for an order that is paid or already cancelled.
func cancel(ctx context.Context, tx *sql.Tx, id, by string) error {
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

// CancelTask is the timeout's business function, in the transaction that
// marks its task done: it cancels the order and releases its stock if the
// order is still unpaid. Run it through outbox.NewConsumer (or
// CancelHandler) so it happens exactly once and never for a paid order.
func (s *Service) CancelTask(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
	return cancel(ctx, tx, m.Key, "timeout")
}

// CancelHandler is CancelTask through outbox.Handle, one message at a time.
func (s *Service) CancelHandler() broker.Handler {
	return outbox.BrokerHandler(s.DB, s.CancelTask)
}

// UnpaidPastDue is the scanner's business query: orders still unpaid more
// than grace after they expired, whatever became of their task.
func (s *Service) UnpaidPastDue(grace time.Duration) func(ctx context.Context, db *sql.DB, limit int) ([]string, error) {
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

// CancelIfUnpaid is the scanner's business handler: it cancels the order
// and its task in one transaction when the order is still unpaid.
func (s *Service) CancelIfUnpaid(ctx context.Context, id string) error {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := outbox.Cancel(ctx, tx, s.topic(), id); err != nil && !errors.Is(err, outbox.ErrNotFound) && !errors.Is(err, outbox.ErrFinished) {
		return err
	}
	if err := cancel(ctx, tx, id, "scanner"); err != nil {
		return err
	}
	return tx.Commit()
}

// Report is what the demo checks at the end.
type Report struct {
	Orders           int            `json:"orders"`
	Paid             int            `json:"paid"`
	Cancelled        int            `json:"cancelled"`
	WronglyCancelled int            `json:"wrongly_cancelled"`
	LeftUnpaid       int            `json:"left_unpaid"`
	Early            int            `json:"early"`
	StockOK          bool           `json:"stock_ok"`
	Lateness         ops.Lateness   `json:"lateness_ms"`
	CancelledBy      map[string]int `json:"cancelled_by"`
}

// Check reads the orders and proves the invariants: no order both paid and
// cancelled, none unpaid more than slack past its expiry, and stock equal to
// the initial stock less what live orders hold.
func (s *Service) Check(ctx context.Context, slack time.Duration) (*Report, error) {
	r := &Report{CancelledBy: map[string]int{}}
	q := func(dst *int, query string, args ...any) error {
		return s.DB.QueryRowContext(ctx, query, args...).Scan(dst)
	}
	if err := q(&r.Orders, "SELECT COUNT(*) FROM demo_orders"); err != nil {
		return nil, err
	}
	if err := q(&r.Paid, "SELECT COUNT(*) FROM demo_orders WHERE status = 'PAID'"); err != nil {
		return nil, err
	}
	if err := q(&r.Cancelled, "SELECT COUNT(*) FROM demo_orders WHERE status = 'CANCELLED'"); err != nil {
		return nil, err
	}
	if err := q(&r.WronglyCancelled, "SELECT COUNT(*) FROM demo_orders WHERE paid_ms IS NOT NULL AND cancelled_ms IS NOT NULL"); err != nil {
		return nil, err
	}
	if err := q(&r.LeftUnpaid, "SELECT COUNT(*) FROM demo_orders WHERE status = 'UNPAID' AND expire_ms < ?", time.Now().Add(-slack).UnixMilli()); err != nil {
		return nil, err
	}
	if err := q(&r.Early, "SELECT COUNT(*) FROM demo_orders WHERE cancelled_ms < expire_ms AND cancelled_by = 'timeout'"); err != nil {
		return nil, err
	}
	var bad int
	if err := q(&bad, `SELECT COUNT(*) FROM demo_inventory i
WHERE i.initial <> i.available + (SELECT COALESCE(SUM(o.qty), 0) FROM demo_orders o WHERE o.sku = i.sku AND o.status <> 'CANCELLED')`); err != nil {
		return nil, err
	}
	r.StockOK = bad == 0
	rows, err := s.DB.QueryContext(ctx, "SELECT cancelled_ms - expire_ms, cancelled_by FROM demo_orders WHERE status = 'CANCELLED'")
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
		r.CancelledBy[by]++
	}
	r.Lateness = ops.Lateness(percentile.Summarize(late))
	return r, rows.Err()
}

// WaitSettled polls Check every poll until every order is paid or
// cancelled, deadline passes or ctx ends, and returns the last report.
func (s *Service) WaitSettled(ctx context.Context, deadline time.Time, poll time.Duration) (*Report, error) {
	for {
		r, err := s.Check(ctx, 0)
		if err != nil {
			return nil, err
		}
		if r.Paid+r.Cancelled == r.Orders || time.Now().After(deadline) || ctx.Err() != nil {
			return r, nil
		}
		time.Sleep(poll)
	}
}

// Show is the read path, GET /orders/{id}: the order's status, except that
// an UNPAID order whose cancel time has passed shows as EXPIRED while its
// handler has not run yet (outbox.Overdue), so no reader ever sees a stale
// UNPAID. Both reads share one read-only transaction, so they see one
// snapshot: never the order from before the handler ran and the task from
// after.
func (s *Service) Show(ctx context.Context, id string) (string, error) {
	tx, err := s.DB.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return "", err
	}
	defer tx.Rollback() //nolint:errcheck // read-only: nothing to keep
	var status string
	if err := tx.QueryRowContext(ctx, "SELECT status FROM demo_orders WHERE id = ?", id).Scan(&status); err != nil {
		return "", fmt.Errorf("orders: show %s: %w", id, err)
	}
	if status != "UNPAID" {
		return status, nil
	}
	overdue, err := outbox.Overdue(ctx, tx, s.topic(), id)
	if err != nil {
		return "", err
	}
	if overdue {
		return "EXPIRED", nil
	}
	return status, nil
}
