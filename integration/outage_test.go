package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// outageLength is how long each broker is out. Long enough that a relay
// holding row locks across its publish would fail every payment touching
// them: payments here give up on a lock after payLockWait.
const (
	outageLength = 60 * time.Second
	payLockWait  = 5 // seconds, innodb_lock_wait_timeout of every payment
)

// TestOutage_PaymentsNeverWaitOnABroker runs orders, payments and the
// whole pipeline (relay, consumer, scanner) while the broker is out for a
// minute: RabbitMQ cut off behind the tests' TCP proxy, RocketMQ frozen
// (SIGSTOP, every connection open and silent). Every payment must commit
// without waiting for a lock, and once the broker is back every task must
// be handled once and never early, no paid order cancelled.
func TestOutage_PaymentsNeverWaitOnABroker(t *testing.T) {
	skipIfShort(t)
	for _, b := range []struct {
		name string
		open func(t *testing.T, topic string) (broker.Publisher, broker.Subscriber, func())
	}{
		{"rabbit", func(t *testing.T, topic string) (broker.Publisher, broker.Subscriber, func()) {
			cfg := rabbitConfig(t)
			u, err := url.Parse(cfg.URL)
			if err != nil {
				t.Fatal(err)
			}
			proxy := testenv.NewProxy(t, u.Host)
			u.Host = proxy.Addr()
			cfg.URL = u.String()
			pub, sub := rabbitClients(t, cfg)
			return pub, sub, func() { proxy.Cut(); time.Sleep(outageLength); proxy.Restore() }
		}},
		{"rocket", func(t *testing.T, topic string) (broker.Publisher, broker.Subscriber, func()) {
			requireRocketMQ(t)
			pub, sub := rocketAdapter(t).open(t, topic)
			return pub, sub, func() { testenv.RocketFreezeBroker(t, outageLength) }
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			f := newFlow(t)
			pub, sub, outage := b.open(t, f.topic)
			f.consume(t, pub, sub)
			f.relay(t, pub)
			sc, err := scanner.New(f.db, pub, scanner.Config{Logger: quiet(), Grace: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			scCtx, stopScanner := context.WithCancel(f.ctx)
			scDone := make(chan struct{})
			go func() { _ = sc.Run(scCtx); close(scDone) }()
			t.Cleanup(func() { stopScanner(); <-scDone })

			w := newOrderTraffic(f)
			ctx, stop := context.WithCancel(f.ctx)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); w.produce(ctx) }()
			go func() { defer wg.Done(); w.pay(ctx) }()

			time.Sleep(10 * time.Second)
			baseline := w.phase("without the outage")
			outage()
			during := w.phase("during the outage")
			time.Sleep(5 * time.Second)
			stop()
			wg.Wait()
			after := w.phase("after it")

			for _, p := range []payPhase{baseline, during, after} {
				t.Logf("%s: payments %s", b.name, p)
				for _, err := range p.errs {
					t.Errorf("%s: a payment %s failed: %v", b.name, p.name, err)
				}
			}
			if during.n == 0 {
				t.Fatal("no payment ran during the outage: the test proved nothing")
			}
			n := int(w.orders.Load())
			var open int
			if !testutil.Eventually(3*time.Minute, 200*time.Millisecond, func() bool {
				open = f.count(t, "SELECT COUNT(*) FROM delay_task WHERE state NOT IN ('done', 'cancelled')")
				return open == 0
			}) {
				t.Fatalf("%d of %d tasks neither done nor cancelled 3 minutes after the broker returned", open, n)
			}
			if bad := f.count(t, "SELECT COUNT(*) FROM orders WHERE paid = 1 AND (status <> 'PAID' OR effects <> 0)"); bad != 0 {
				t.Fatalf("%d paid orders were cancelled", bad)
			}
			if bad := f.count(t, "SELECT COUNT(*) FROM orders WHERE paid = 0 AND (status <> 'CANCELLED' OR effects <> 1)"); bad != 0 {
				t.Fatalf("%d unpaid orders not cancelled exactly once (lost or duplicated effects)", bad)
			}
			if bad := f.count(t, `SELECT COUNT(*) FROM orders o JOIN delay_task d ON d.task_key = o.id
WHERE (o.paid = 1 AND d.state <> 'cancelled') OR (o.paid = 0 AND d.state <> 'done')`); bad != 0 {
				t.Fatalf("%d tasks in a state that contradicts their order", bad)
			}
			t.Logf("%s: %d orders, %d paid, every task settled once the broker returned", b.name, n, w.paidTotal.Load())
		})
	}
}

// orderTraffic writes orders with their timeout tasks and pays about half
// of them right after, while their tasks are pending, being published or
// waiting in the broker.
type orderTraffic struct {
	f         *flow
	orders    atomic.Int64
	paidTotal atomic.Int64
	toPay     chan string

	mu   sync.Mutex
	lat  []time.Duration
	errs []error
}

func newOrderTraffic(f *flow) *orderTraffic {
	return &orderTraffic{f: f, toPay: make(chan string, 10_000)}
}

func (w *orderTraffic) produce(ctx context.Context) {
	defer close(w.toPay)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		id := fmt.Sprintf("o-%d", i)
		due := time.Now().Add(time.Duration(i%30) * 100 * time.Millisecond)
		if err := w.order(ctx, id, due); err != nil {
			if ctx.Err() != nil {
				return // stopped mid-order: it rolled back
			}
			w.record(0, fmt.Errorf("order %s: %w", id, err))
			continue
		}
		w.orders.Add(1)
		if i%2 == 0 {
			w.toPay <- id
		}
	}
}

func (w *orderTraffic) order(ctx context.Context, id string, due time.Time) error {
	tx, err := w.f.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, status) VALUES (?, 'UNPAID')", id); err != nil {
		return err
	}
	if _, err := outbox.Schedule(ctx, tx, outbox.Task{Topic: w.f.topic, Key: id, DueAt: due}); err != nil {
		return err
	}
	return tx.Commit()
}

// pay pays each order handed to it, the way an order service does: cancel
// the task and mark the order paid in one transaction. The timeout winning
// (ErrFinished) is a normal outcome; any other error is a failed payment.
func (w *orderTraffic) pay(ctx context.Context) {
	for id := range w.toPay {
		start := time.Now()
		paid, err := w.payOne(context.WithoutCancel(ctx), id)
		w.record(time.Since(start), err)
		if paid {
			w.paidTotal.Add(1)
		}
	}
}

func (w *orderTraffic) payOne(ctx context.Context, id string) (bool, error) {
	conn, err := w.f.db.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION innodb_lock_wait_timeout = %d", payLockWait)); err != nil {
		return false, err
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := outbox.Cancel(ctx, tx, w.f.topic, id); errors.Is(err, outbox.ErrFinished) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("cancel %s: %w", id, err)
	}
	res, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'PAID', paid = 1 WHERE id = ? AND status = 'UNPAID'", id)
	if err != nil {
		return false, fmt.Errorf("pay %s: %w", id, err)
	}
	if k, _ := res.RowsAffected(); k != 1 {
		return false, fmt.Errorf("pay %s: the task was cancelled but the order was not UNPAID", id)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("commit payment %s: %w", id, err)
	}
	return true, nil
}

func (w *orderTraffic) record(d time.Duration, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.errs = append(w.errs, err)
		return
	}
	w.lat = append(w.lat, d)
}

// payPhase summarises the payments since the last phase.
type payPhase struct {
	name          string
	n             int
	p50, p99, max time.Duration
	errs          []error
}

func (p payPhase) String() string {
	return fmt.Sprintf("%s: %d committed, p50 %v, p99 %v, max %v, %d failed", p.name, p.n,
		p.p50.Round(100*time.Microsecond), p.p99.Round(100*time.Microsecond), p.max.Round(100*time.Microsecond), len(p.errs))
}

func (w *orderTraffic) phase(name string) payPhase {
	w.mu.Lock()
	lat, errs := w.lat, w.errs
	w.lat, w.errs = nil, nil
	w.mu.Unlock()
	p := payPhase{name: name, n: len(lat), errs: errs}
	if len(lat) > 0 {
		slices.Sort(lat)
		p.p50, p.p99, p.max = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)], lat[len(lat)-1]
	}
	return p
}

// TestOutage_ADatabaseOutageSendsNoTaskToDead cuts the consumer's handler
// off from its database (behind the tests' TCP proxy) for longer than all
// its attempts' backoffs take, while tasks come due. Every failure was the
// database's, not a task's: none may go to dead, and once the database is
// back every task is handled once. Spending an attempt on each failure
// would send them all to dead within a second here (the whole backoff
// ladder of MaxAttempts 3 at 50 ms is under a second). The dead letter
// and the retry record write over a connection the cut does not touch: a
// database that comes and goes lets such a write through between the
// handler's failures, and a dead letter that cannot write would give the
// message back and hide what the attempts count.
func TestOutage_ADatabaseOutageSendsNoTaskToDead(t *testing.T) {
	skipIfShort(t)
	for _, a := range []adapter{rabbitAdapter(t), rocketAdapter(t)} {
		t.Run(a.name, func(t *testing.T) {
			if a.name == "rocket" {
				requireRocketMQ(t)
			}
			f := newFlow(t)
			pub, sub := a.open(t, f.topic)
			cdb, proxy := testenv.ProxiedDB(t, f.dsn)
			c, err := outbox.NewConsumer(cdb, sub, pub, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
				_, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'CANCELLED', effects = effects + 1 WHERE id = ? AND status = 'UNPAID'", m.Key)
				return err
			}, broker.ConsumerConfig{Logger: quiet(), MaxAttempts: 3,
				Backoff:    broker.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond},
				DeadLetter: outbox.DeadLetter(f.db, nil), OnRetry: outbox.RecordRetry(f.db)})
			f.start(t, c, err)
			f.relay(t, pub)

			proxy.Cut()
			const n = 20
			due := time.Now().Add(2 * time.Second)
			for i := range n {
				f.order(t, fmt.Sprintf("o-%02d", i), due)
			}
			time.Sleep(time.Until(due) + 6*time.Second)
			if done := f.count(t, "SELECT COUNT(*) FROM delay_task WHERE state = 'done'"); done != 0 {
				t.Fatalf("%d tasks done while the consumer's database was cut off: the test cut nothing", done)
			}
			proxy.Restore()
			var open int
			if !testutil.Eventually(time.Minute, 200*time.Millisecond, func() bool {
				open = f.count(t, "SELECT COUNT(*) FROM delay_task WHERE state <> 'done'")
				return open == 0
			}) {
				dead := f.count(t, "SELECT COUNT(*) FROM delay_task WHERE state = 'dead'")
				t.Fatalf("%d of %d tasks not done a minute after the database came back, %d of them dead", open, n, dead)
			}
			if bad := f.count(t, "SELECT COUNT(*) FROM orders WHERE status <> 'CANCELLED' OR effects <> 1"); bad != 0 {
				t.Fatalf("%d orders not cancelled exactly once", bad)
			}
		})
	}
}
