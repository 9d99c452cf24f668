package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/driver"
	ordertimeout "github.com/delaybridge/delaybridge/internal/orders"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/scanner"
)

func newDemoCmd(a *app) *cobra.Command {
	var (
		bf       brokerFlags
		orders   int
		timeout  time.Duration
		spread   time.Duration
		payRatio float64
		asJSON   bool
		wait     time.Duration
		httpAddr string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the order-timeout story end to end and prove its invariants",
		Long: `demo runs the order service of examples/ordertimeout against the real
database and broker: it
creates --orders orders over --spread, each reserving stock and scheduling its
own cancellation --timeout later in the same transaction; pays about
--pay-ratio of them at a random moment between creation and a little after
the timeout (so some payments lose the race and are refunded by a task of
their own), a quarter of those through a payment still pending at the
channel at the cancel time (the timeout snoozes until its callback); reads
every order as its cancel time passes (a read cancels an expired order at
once); and runs the relay, the scanner (with the unpaid-orders business
source) and the cancel and refund consumers in this process, on one
delaybridge.Client, as examples/ordertimeout does. When every order is paid
or cancelled it prints a summary: orders, paid, cancelled, wrongly cancelled
(paid, yet cancelled, or its timeout task ran: must be 0), left unpaid past
due (must be 0), stock consistent, payments in flight and snoozes, refused
payments and refunds, reads, and the lateness of the cancellations.
It exits non-zero when an invariant is broken. It replaces the demo_orders,
demo_inventory and demo_refunds tables and the order-cancel and order-refund
tasks of earlier runs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if orders <= 0 || timeout <= 0 || !(payRatio >= 0 && payRatio <= 1) || spread < 0 || wait < 0 {
				return fmt.Errorf("need --orders > 0, --timeout > 0, 0 <= --pay-ratio <= 1, --spread >= 0 and --wait >= 0")
			}
			// Before anything touches the database: a bad --http changes
			// nothing.
			ln, err := a.listenMetrics(httpAddr)
			if err != nil {
				return err
			}
			if ln != nil {
				defer ln.Close()
			}
			a.useDevDefaults(&bf)
			if err := bf.check(a); err != nil {
				return err
			}
			db, err := a.openDB(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			if _, err := outbox.Migrate(ctx, db); err != nil {
				return err
			}
			m := newMetrics(db, 30*time.Second, a.log)
			// The demo's topics and the dead-letter topic, on RocketMQ.
			bf.RocketCreateTopics = true
			cfg, err := bf.config(a)
			if err != nil {
				return err
			}
			defer a.serveMetricsOn(ln, m, db, demoBrokerAddr(bf.Settings))()
			svc := &ordertimeout.Service{DB: db, Timeout: timeout, Channel: &ordertimeout.Channel{}}
			if err := svc.Setup(ctx, []string{"sku-a", "sku-b", "sku-c"}, 1_000_000); err != nil {
				return err
			}
			// One Client is the whole order service, as in
			// examples/ordertimeout: the cancel and refund consumers, the relay
			// and the scanner with the unpaid-orders business source.
			cfg.Relay = &delaybridge.RelayConfig{IdleMax: 100 * time.Millisecond}
			cfg.Scanner = &scanner.Config{Grace: 5 * time.Second, Interval: 500 * time.Millisecond,
				Business: &scanner.Business{Name: "unpaid-orders", Every: 2 * time.Second, Query: svc.UnpaidPastDue(15 * time.Second), Handle: svc.CancelIfUnpaid}}
			cfg.Consumer = broker.ConsumerConfig{Concurrency: 16}
			cfg.Metrics = m.Metrics
			client, err := delaybridge.NewClient(db, cfg)
			if err != nil {
				return err
			}
			if err := client.Handle(ordertimeout.Topic, svc.CancelTask); err != nil {
				return err
			}
			if err := client.Handle(ordertimeout.RefundTopic, svc.RefundTask); err != nil {
				return err
			}
			if err := client.Start(ctx); err != nil {
				return err
			}
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = client.Stop(sctx)
			}()

			fmt.Fprintf(a.stdout, "demo: %d orders over %v on %s (%s), timeout %v, paying about %.0f%%\n", orders, spread, bf.Broker, bf.mode(), timeout, payRatio*100)
			c, err := demoOrders(ctx, a, svc, orders, spread, payRatio)
			if err != nil {
				return err
			}
			if _, err := svc.WaitSettled(ctx, time.Now().Add(timeout+wait), int(c.refused.Load()), 200*time.Millisecond); err != nil {
				return err
			}
			// Judge "left unpaid past due" with a little slack for the last
			// cancellations in flight.
			r, err := svc.Check(ctx, 2*time.Second)
			if err != nil {
				return err
			}
			// The handler cancels only unpaid orders, so a paid order is never
			// also cancelled, even when Handle wrongly runs the handler for a
			// cancelled task. What gives that away is the task: the payment
			// cancelled it, so it must still be cancelled, never done.
			ranForPaid, err := tasksRunForPaidOrders(ctx, db)
			if err != nil {
				return err
			}
			wrong := r.WronglyCancelled + ranForPaid
			paid, refused, inFlight, inFlightPaid := c.paid.Load(), c.refused.Load(), c.inFlight.Load(), c.inFlightPaid.Load()
			fmt.Fprintf(a.stdout, "orders %d, paid %d, cancelled %d (by timeout %d, by a read %d, by scanner %d)\n",
				r.Orders, r.Paid, r.Cancelled, r.CancelledBy["timeout"], r.CancelledBy["read"], r.CancelledBy["scanner"])
			fmt.Fprintf(a.stdout, "wrongly cancelled (paid, yet cancelled, or its timeout task ran): %d\nleft unpaid past due: %d\ncancelled before due: %d\nstock consistent: %v\n", wrong, r.LeftUnpaid, r.Early, r.StockOK)
			fmt.Fprintf(a.stdout, "payments in flight at the cancel time: %d, paid %d, their timeouts snoozed: %d\n", inFlight, inFlightPaid, r.Snoozed)
			fmt.Fprintf(a.stdout, "payments refused as too late: %d, refunded: %d (of orders not cancelled: %d)\n", refused, r.Refunds, r.RefundedPaid)
			fmt.Fprintf(a.stdout, "reads at the cancel time: %d, shown EXPIRED %d, shown UNPAID %d\n", c.reads.Load(), c.shownExpired.Load(), c.shownUnpaid.Load())
			fmt.Fprintf(a.stdout, "cancellation lateness: p50 %dms p99 %dms max %dms\n", r.Lateness.P50, r.Lateness.P99, r.Lateness.Max)
			if asJSON {
				out := map[string]any{"broker": bf.Broker, "mode": bf.mode(), "orders": r.Orders, "paid": r.Paid, "cancelled": r.Cancelled,
					"wrongly_cancelled": wrong, "left_unpaid": r.LeftUnpaid, "early": r.Early, "stock_ok": r.StockOK,
					"cancelled_by": r.CancelledBy, "in_flight": inFlight, "in_flight_paid": inFlightPaid, "snoozed": r.Snoozed,
					"refused": refused, "refunds": r.Refunds, "refunded_paid": r.RefundedPaid, "shown_unpaid": c.shownUnpaid.Load(),
					"lateness_ms": map[string]int64{"p50": r.Lateness.P50, "p99": r.Lateness.P99, "max": r.Lateness.Max}}
				b, _ := json.Marshal(out)
				fmt.Fprintln(a.stdout, string(b))
			}
			if wrong != 0 || r.LeftUnpaid != 0 || !r.StockOK || r.Early != 0 || int64(r.Paid) != paid ||
				inFlightPaid != inFlight || int64(r.Refunds) != refused || r.RefundedPaid != 0 || c.shownUnpaid.Load() != 0 {
				return fmt.Errorf("demo: an invariant is broken (payments that went through: %d)", paid)
			}
			return nil
		},
	}
	f := cmd.Flags()
	bf.register(f)
	f.IntVar(&orders, "orders", 300, "orders to create")
	f.DurationVar(&timeout, "timeout", 5*time.Second, "how long an order may stay unpaid")
	f.DurationVar(&spread, "spread", 3*time.Second, "how long creating the orders takes")
	f.Float64Var(&payRatio, "pay-ratio", 0.5, "share of orders a customer tries to pay")
	f.BoolVar(&asJSON, "json", false, "end with one JSON object on the last line")
	f.DurationVar(&wait, "wait", 60*time.Second, "wait past the last timeout for orders to settle")
	f.StringVar(&httpAddr, "http", "", "serve /metrics here while the demo runs (empty = off)")
	return cmd
}

// demoCounts is what the demo's customers and reader saw.
type demoCounts struct {
	paid, refused          atomic.Int64 // payments that went through; refused ones
	inFlight, inFlightPaid atomic.Int64 // payments pending at the cancel time; those paid
	reads                  atomic.Int64
	shownExpired           atomic.Int64
	shownUnpaid            atomic.Int64 // reads after the cancel time that showed UNPAID
}

// demoOrders creates n orders over spread, pays about payRatio of them
// and reads each as its cancel time passes. It returns when every payment
// and read is done.
func demoOrders(ctx context.Context, a *app, svc *ordertimeout.Service, n int, spread time.Duration, payRatio float64) (*demoCounts, error) {
	c := &demoCounts{}
	timeout := svc.Timeout
	var wg sync.WaitGroup
	defer wg.Wait()
	// One reader, each order in turn, shortly after its cancel time: it
	// races the broker's delivery of the timeout.
	type read struct {
		id  string
		due time.Time
	}
	reads := make(chan read, n)
	defer close(reads)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for r := range reads {
			select {
			case <-ctx.Done():
				continue
			case <-time.After(time.Until(r.due.Add(time.Duration(rand.IntN(5)) * time.Millisecond))):
			}
			status, _, err := svc.Show(ctx, r.id)
			if err != nil {
				a.log.Warn("demo: read failed", "order", r.id, "err", err)
				continue
			}
			c.reads.Add(1)
			switch status {
			case "EXPIRED":
				c.shownExpired.Add(1)
			case "UNPAID":
				c.shownUnpaid.Add(1)
			}
		}
	}()
	// pay is the channel's callback; it reports whether the payment went
	// through.
	pay := func(id string) bool {
		ok, err := svc.Pay(ctx, id)
		switch {
		case err != nil:
			a.log.Warn("demo: payment failed", "order", id, "err", err)
		case ok:
			c.paid.Add(1)
		default:
			c.refused.Add(1)
		}
		return ok
	}
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(float64(spread) * float64(i) / float64(n)))); d > 0 {
			time.Sleep(d)
		}
		id := fmt.Sprintf("order-%d-%d", start.Unix(), i)
		if err := svc.CreateOrder(ctx, id, []string{"sku-a", "sku-b", "sku-c"}[i%3], 1+i%4); err != nil {
			return nil, err
		}
		// At or after the order's cancel time.
		due := time.Now().Add(timeout)
		reads <- read{id, due}
		if rand.Float64() >= payRatio {
			continue
		}
		wg.Add(1)
		if rand.IntN(4) > 0 {
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(rand.Float64() * 1.2 * float64(timeout)))
				pay(id)
			}()
			continue
		}
		// A payment started in time whose callback comes after the cancel
		// time: the timeout must wait for it.
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(rand.Float64() * 0.8 * float64(timeout)))
			if ok, err := svc.StartPayment(ctx, id); err != nil || !ok {
				if err != nil {
					a.log.Warn("demo: starting a payment failed", "order", id, "err", err)
				}
				return
			}
			c.inFlight.Add(1)
			time.Sleep(time.Until(due.Add(timeout / 2)))
			if pay(id) {
				c.inFlightPaid.Add(1)
			}
			svc.Channel.Settle(id)
		}()
	}
	return c, nil
}

// demoBrokerAddr is the broker address the demo's /readyz dials: the
// AMQP URL's host and port, or the first RocketMQ name server.
func demoBrokerAddr(cfg driver.Settings) string {
	if cfg.Broker == "rocket" {
		rc, err := driver.ConfigOf[rocket.Config](&cfg, nil)
		if err != nil || len(rc.NameServers) == 0 {
			return ""
		}
		return rc.NameServers[0]
	}
	u, err := url.Parse(cfg.AMQPURL)
	if err != nil {
		return ""
	}
	port := u.Port()
	if port == "" {
		port = map[bool]string{true: "5671", false: "5672"}[u.Scheme == "amqps"]
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// tasksRunForPaidOrders counts the paid demo orders whose timeout task is
// not cancelled. Pay cancels the task in the payment's transaction and
// nothing may move a cancelled task on, so each one counted is a task
// whose handler ran for an order that was paid.
func tasksRunForPaidOrders(ctx context.Context, db *sql.DB) (int, error) {
	rows, err := db.QueryContext(ctx, "SELECT id FROM demo_orders WHERE status = 'PAID'")
	if err != nil {
		return 0, err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		info, err := outbox.Get(ctx, db, ordertimeout.Topic, id)
		if err != nil {
			return 0, fmt.Errorf("demo: task of paid order %s: %w", id, err)
		}
		if info.State != outbox.StateCancelled {
			n++
		}
	}
	return n, nil
}
