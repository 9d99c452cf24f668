package orders

import (
	"cmp"
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

// The default topics: an order's cancellation, and the refund of a
// payment that came too late.
const (
	Topic       = "order-cancel"
	RefundTopic = "order-refund"
)

// DefaultRecheck is how long the timeout waits by default before asking
// the channel again about a pending payment.
const DefaultRecheck = 500 * time.Millisecond

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
	// RefundTopic is the topic of refunds. Default RefundTopic.
	RefundTopic string
	// Channel is the payment channel the timeout asks before it cancels.
	// StartPayment needs one; nil means no payment is ever pending.
	Channel *Channel
	// Recheck is how long the timeout waits for a pending payment before
	// asking again. Default DefaultRecheck.
	Recheck time.Duration
	// Nudge, when set, is called after a task commits (Relay.Nudge).
	Nudge func()
}

func (s *Service) topic() string       { return cmp.Or(s.Topic, Topic) }
func (s *Service) refundTopic() string { return cmp.Or(s.RefundTopic, RefundTopic) }

// nudge wakes the relay for a task just committed.
func (s *Service) nudge() {
	if s.Nudge != nil {
		s.Nudge()
	}
}

// Setup creates the tables if needed and stocks each sku with n units,
// replacing earlier demo data and tasks.
func (s *Service) Setup(ctx context.Context, skus []string, n int) error {
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
		if _, err := s.DB.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("ordertimeout: setup: %w", err)
		}
	}
	if _, err := s.DB.ExecContext(ctx, "DELETE FROM delay_task WHERE topic IN (?, ?)", s.topic(), s.refundTopic()); err != nil {
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
	s.nudge()
	return nil
}

// StartPayment is the customer paying through the channel: the order shows
// PAYING until the channel's callback, Pay. It reports false for an order
// no longer UNPAID or past its cancel time.
func (s *Service) StartPayment(ctx context.Context, id string) (bool, error) {
	if s.Channel == nil {
		return false, errors.New("orders: StartPayment needs a Channel")
	}
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if late, err := outbox.Overdue(ctx, tx, s.topic(), id); err != nil || late {
		return false, err
	}
	res, err := tx.ExecContext(ctx, "UPDATE demo_orders SET status = 'PAYING' WHERE id = ? AND status = 'UNPAID'", id)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return false, nil
	}
	// Before the commit: a timeout that reads PAYING must find it pending.
	s.Channel.Start(id)
	return true, tx.Commit()
}

// Pay is the channel's callback: order id's payment was captured. It marks
// the order paid and cancels its timeout task in one transaction, taking
// the task's lock before the order's, as the timeout does, so the two never
// deadlock. It reports false when the payment came too late: the timeout
// ran first, or an UNPAID order is past its cancel time (reads show it
// EXPIRED already, so a payment must not revive it). The money of a refused
// payment goes back through a refund task keyed by the order, so a second
// callback refunds nothing more.
func (s *Service) Pay(ctx context.Context, id string) (bool, error) {
	paid, err := s.pay(ctx, id)
	if err != nil || paid {
		return paid, err
	}
	return false, s.refund(ctx, id)
}

func (s *Service) pay(ctx context.Context, id string) (bool, error) {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var status string
	if err := tx.QueryRowContext(ctx, "SELECT status FROM demo_orders WHERE id = ?", id).Scan(&status); err != nil {
		return false, fmt.Errorf("orders: pay %s: %w", id, err)
	}
	// A PAYING order started in time: its timeout waits for this callback.
	if status == "UNPAID" {
		if late, err := outbox.Overdue(ctx, tx, s.topic(), id); err != nil || late {
			return false, err
		}
	}
	if err := outbox.Cancel(ctx, tx, s.topic(), id); errors.Is(err, outbox.ErrFinished) {
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

// refund schedules the refund of order id's payment, due at once.
func (s *Service) refund(ctx context.Context, id string) error {
	_, err := outbox.Schedule(ctx, s.DB, outbox.Task{Topic: s.refundTopic(), Key: id, DueAt: time.Now()})
	if errors.Is(err, outbox.ErrDuplicate) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("orders: refund %s: %w", id, err)
	}
	s.nudge()
	return nil
}

// RefundTask is the refund's business function: it gives the money back
// (here it records the refund) in the transaction that marks its task done,
// so each refund happens once.
func (s *Service) RefundTask(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO demo_refunds (id, refunded_ms) VALUES (?, ?)", m.Key, time.Now().UnixMilli())
	return err
}

// cancel cancels order id and releases its stock inside tx. It leaves a
// paid or cancelled order as it is, and one whose payment is pending at
// the channel, which it reports.
func (s *Service) cancel(ctx context.Context, tx *sql.Tx, id, by string) (pending bool, err error) {
	var sku, status string
	var qty int
	err = tx.QueryRowContext(ctx, "SELECT sku, qty, status FROM demo_orders WHERE id = ? AND status IN ('UNPAID', 'PAYING') FOR UPDATE", id).Scan(&sku, &qty, &status)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if status == "PAYING" && s.Channel.Pending(id) {
		return true, nil
	}
	if _, err := tx.ExecContext(ctx, "UPDATE demo_orders SET status = 'CANCELLED', cancelled_ms = ?, cancelled_by = ? WHERE id = ?",
		time.Now().UnixMilli(), by, id); err != nil {
		return false, err
	}
	_, err = tx.ExecContext(ctx, "UPDATE demo_inventory SET available = available + ? WHERE sku = ?", qty, sku)
	return false, err
}

// expire is the timeout of order id, run by a delivery or a read (by): it
// cancels the order, or snoozes while its payment is pending.
func (s *Service) expire(ctx context.Context, tx *sql.Tx, id, by string) error {
	pending, err := s.cancel(ctx, tx, id, by)
	if err == nil && pending {
		return outbox.Snooze(cmp.Or(s.Recheck, DefaultRecheck), "payment pending at the channel")
	}
	return err
}

// CancelTask is the timeout's business function, in the transaction that
// marks its task done: it cancels the order and releases its stock unless
// the order is paid, and snoozes while a payment is pending at the
// channel. Run it through outbox.NewConsumer (or CancelHandler) so it
// happens exactly once and never for a paid order.
func (s *Service) CancelTask(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
	return s.expire(ctx, tx, m.Key, "timeout")
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
// and its task in one transaction when the order is still unpaid and no
// payment of it is pending.
func (s *Service) CancelIfUnpaid(ctx context.Context, id string) error {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := outbox.Cancel(ctx, tx, s.topic(), id); err != nil && !errors.Is(err, outbox.ErrNotFound) && !errors.Is(err, outbox.ErrFinished) {
		return err
	}
	// A payment pending at the channel keeps its order and its task.
	if pending, err := s.cancel(ctx, tx, id, "scanner"); err != nil || pending {
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
	Refunds          int            `json:"refunds"`       // refunds made
	RefundedPaid     int            `json:"refunded_paid"` // refunds of an order not cancelled
	Snoozed          int            `json:"snoozed"`       // timeout tasks that waited for a pending payment
	StockOK          bool           `json:"stock_ok"`
	Lateness         ops.Lateness   `json:"lateness_ms"`
	CancelledBy      map[string]int `json:"cancelled_by"`
}

// Check reads the orders and proves the invariants: no order both paid and
// cancelled, none unpaid more than slack past its expiry, no refund of an
// order that was not cancelled, and stock equal to the initial stock less
// what live orders hold.
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
	if err := q(&r.Early, "SELECT COUNT(*) FROM demo_orders WHERE cancelled_ms < expire_ms AND cancelled_by IN ('timeout', 'read')"); err != nil {
		return nil, err
	}
	if err := q(&r.Refunds, "SELECT COUNT(*) FROM demo_refunds"); err != nil {
		return nil, err
	}
	if err := q(&r.RefundedPaid, "SELECT COUNT(*) FROM demo_refunds f JOIN demo_orders o ON o.id = f.id WHERE o.status <> 'CANCELLED'"); err != nil {
		return nil, err
	}
	if err := q(&r.Snoozed, "SELECT COUNT(*) FROM delay_task WHERE topic = ? AND snoozes > 0", s.topic()); err != nil {
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
// cancelled and at least refunds refunds are made, deadline passes or ctx
// ends, and returns the last report.
func (s *Service) WaitSettled(ctx context.Context, deadline time.Time, refunds int, poll time.Duration) (*Report, error) {
	for {
		r, err := s.Check(ctx, 0)
		if err != nil {
			return nil, err
		}
		if (r.Paid+r.Cancelled == r.Orders && r.Refunds >= refunds) || time.Now().After(deadline) || ctx.Err() != nil {
			return r, nil
		}
		time.Sleep(poll)
	}
}

// Show is the read path, GET /orders/{id}: the order's status, except
// that an UNPAID order past its cancel time never shows as UNPAID. The
// read runs the timeout itself (outbox.RunNow), so the order is cancelled
// and its stock released at once, and the delivery that follows finds the
// task done. Show reports whether this read cancelled the order. One it
// could not cancel (its task is dead, say) shows EXPIRED.
func (s *Service) Show(ctx context.Context, id string) (string, bool, error) {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return "", false, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var status string
	if err := tx.QueryRowContext(ctx, "SELECT status FROM demo_orders WHERE id = ?", id).Scan(&status); err != nil {
		return "", false, fmt.Errorf("orders: show %s: %w", id, err)
	}
	if status != "UNPAID" {
		return status, false, nil
	}
	overdue, err := outbox.Overdue(ctx, tx, s.topic(), id)
	if err != nil || !overdue {
		return status, false, err
	}
	ran, err := outbox.RunNow(ctx, tx, s.topic(), id, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		return s.expire(ctx, tx, m.Key, "read")
	})
	if err != nil {
		return "", false, err // the rollback undoes the handler's writes
	}
	// A locking read: the plain one above saw the snapshot from before a
	// delivery, a payment or RunNow changed the order.
	if err := tx.QueryRowContext(ctx, "SELECT status FROM demo_orders WHERE id = ? FOR UPDATE", id).Scan(&status); err != nil {
		return "", false, fmt.Errorf("orders: show %s: %w", id, err)
	}
	// RunNow's writes, a snooze included, commit with the read.
	if err := tx.Commit(); err != nil {
		return "", false, err
	}
	if status == "UNPAID" {
		status = "EXPIRED"
	}
	return status, ran, nil
}
