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
the timeout (so some payments lose the race); and runs the relay, the scanner
(with the unpaid-orders business source) and the cancel consumer in this
process, on one delaybridge.Client, as examples/ordertimeout does. When every order is paid or cancelled it prints a summary: orders,
paid, cancelled, wrongly cancelled (paid, yet cancelled, or its timeout task
ran: must be 0), left unpaid past due (must be 0), stock consistent, and the
lateness of the cancellations.
It exits non-zero when an invariant is broken. It replaces the demo_orders and
demo_inventory tables and the order-cancel tasks of earlier runs.`,
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
			// The demo's topic and the dead-letter topic, on RocketMQ.
			bf.RocketCreateTopics = true
			cfg, err := bf.config(a)
			if err != nil {
				return err
			}
			defer a.serveMetricsOn(ln, m, db, demoBrokerAddr(bf.Settings))()
			svc := &ordertimeout.Service{DB: db, Timeout: timeout}
			if err := svc.Setup(ctx, []string{"sku-a", "sku-b", "sku-c"}, 1_000_000); err != nil {
				return err
			}
			// One Client is the whole order service, as in
			// examples/ordertimeout: the cancel consumer, the relay and the
			// scanner with the unpaid-orders business source.
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
			if err := client.Start(ctx); err != nil {
				return err
			}
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = client.Stop(sctx)
			}()

			fmt.Fprintf(a.stdout, "demo: %d orders over %v on %s (%s), timeout %v, paying about %.0f%%\n", orders, spread, bf.Broker, bf.mode(), timeout, payRatio*100)
			var paid atomic.Int64
			var pays sync.WaitGroup
			start := time.Now()
			for i := range orders {
				if d := time.Until(start.Add(time.Duration(float64(spread) * float64(i) / float64(orders)))); d > 0 {
					time.Sleep(d)
				}
				id := fmt.Sprintf("order-%d-%d", start.Unix(), i)
				if err := svc.CreateOrder(ctx, id, []string{"sku-a", "sku-b", "sku-c"}[i%3], 1+i%4); err != nil {
					return err
				}
				if rand.Float64() < payRatio {
					pays.Add(1)
					go func() {
						defer pays.Done()
						time.Sleep(time.Duration(rand.Float64() * 1.2 * float64(timeout)))
						if ok, err := svc.Pay(ctx, id); err != nil {
							a.log.Warn("demo: payment failed", "order", id, "err", err)
						} else if ok {
							paid.Add(1)
						}
					}()
				}
			}
			pays.Wait()
			if _, err := svc.WaitSettled(ctx, time.Now().Add(timeout+wait), 200*time.Millisecond); err != nil {
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
			fmt.Fprintf(a.stdout, "orders %d, paid %d, cancelled %d (by timeout %d, by scanner %d)\n", r.Orders, r.Paid, r.Cancelled, r.CancelledBy["timeout"], r.CancelledBy["scanner"])
			fmt.Fprintf(a.stdout, "wrongly cancelled (paid, yet cancelled, or its timeout task ran): %d\nleft unpaid past due: %d\ncancelled before due: %d\nstock consistent: %v\n", wrong, r.LeftUnpaid, r.Early, r.StockOK)
			fmt.Fprintf(a.stdout, "cancellation lateness: p50 %dms p99 %dms max %dms\n", r.Lateness.P50, r.Lateness.P99, r.Lateness.Max)
			if asJSON {
				out := map[string]any{"broker": bf.Broker, "mode": bf.mode(), "orders": r.Orders, "paid": r.Paid, "cancelled": r.Cancelled,
					"wrongly_cancelled": wrong, "left_unpaid": r.LeftUnpaid, "early": r.Early, "stock_ok": r.StockOK,
					"lateness_ms": map[string]int64{"p50": r.Lateness.P50, "p99": r.Lateness.P99, "max": r.Lateness.Max}}
				b, _ := json.Marshal(out)
				fmt.Fprintln(a.stdout, string(b))
			}
			if wrong != 0 || r.LeftUnpaid != 0 || !r.StockOK || r.Early != 0 || int64(r.Paid) != paid.Load() {
				return fmt.Errorf("demo: an invariant is broken (payments that went through: %d)", paid.Load())
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
