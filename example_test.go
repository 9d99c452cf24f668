package delaybridge_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/delaybridge/delaybridge"
	// The adapters DELAYBRIDGE_BROKER may name; a service imports its own.
	_ "github.com/delaybridge/delaybridge/rabbit"
	_ "github.com/delaybridge/delaybridge/rocket"
)

// An order service with timeout auto-cancel. Each order schedules its own
// cancellation in the transaction that creates it; paying cancels the
// cancellation in the payment's transaction; the handler cancels what is
// still unpaid, in the transaction that marks the task done. The settings
// come from the DELAYBRIDGE_* environment and the config file, as the
// daemon reads them (scripts/services.sh env prints the local ones).
func Example() {
	ctx := context.Background()
	cfg, db := openOrders(ctx)
	defer db.Close()
	// This process relays its own tasks, with the scanner that re-publishes
	// what a broker lost or a killed relay left; usually delaybridge run does.
	cfg.Relay = &delaybridge.RelayConfig{IdleMax: 100 * time.Millisecond}
	cfg.Scanner = &delaybridge.ScannerConfig{}
	client, err := delaybridge.NewClient(db, cfg)
	if err != nil {
		log.Fatal(err)
	}
	err = client.Handle("order-cancel", func(ctx context.Context, tx *sql.Tx, m *delaybridge.Message) error {
		_, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'CANCELLED' WHERE id = ? AND status = 'UNPAID'", m.Key)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx)

	// Two orders, each cancelled one second after it was placed unless paid.
	// Their ids are new on every run, as a real order's are: a (topic, key)
	// has one task until the cleaner deletes it.
	run := time.Now().UnixNano()
	order1, order2 := fmt.Sprintf("order-1-%d", run), fmt.Sprintf("order-2-%d", run)
	for _, id := range []string{order1, order2} {
		err := inTx(ctx, db, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, status) VALUES (?, 'UNPAID')", id); err != nil {
				return err
			}
			_, err := client.Schedule(ctx, tx, delaybridge.Task{Topic: "order-cancel", Key: id, DueAt: time.Now().Add(time.Second)})
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	// order-1 is paid in time: lock its task first, then the order. Had its
	// handler run already, Cancel would return delaybridge.ErrFinished: the
	// order is cancelled, and the payment is refused (rolled back here).
	err = inTx(ctx, db, func(tx *sql.Tx) error {
		if err := client.Cancel(ctx, tx, "order-cancel", order1); errors.Is(err, delaybridge.ErrFinished) {
			return fmt.Errorf("order %s: too late, its timeout cancelled it", order1)
		} else if err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'PAID' WHERE id = ? AND status = 'UNPAID'", order1)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// order-2 is not: its handler cancels it once due.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		info, err := client.Get(ctx, db, "order-cancel", order2)
		if err != nil {
			log.Fatal(err)
		}
		if info.State == delaybridge.StateDone || time.Now().After(deadline) {
			break
		}
	}
	for i, id := range []string{order1, order2} {
		var status string
		if err := db.QueryRowContext(ctx, "SELECT status FROM orders WHERE id = ?", id).Scan(&status); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("order-%d %s\n", i+1, status)
	}
	// Output:
	// order-1 PAID
	// order-2 CANCELLED
}

// The read path's lazy check: between an order's cancel time and the
// moment its handler has run, the row still says UNPAID. A GET that must
// never show a stale UNPAID asks Overdue and shows the order as expired.
// Overdue needs no broker and no Start.
func ExampleClient_Overdue() {
	ctx := context.Background()
	cfg, db := openOrders(ctx)
	defer db.Close()
	client, err := delaybridge.NewClient(db, cfg)
	if err != nil {
		log.Fatal(err)
	}
	// Due 3 s out, so the first look comes before it even when the commit
	// is slow. The id is new on every run, as in Example.
	order3 := fmt.Sprintf("order-3-%d", time.Now().UnixNano())
	due := time.Now().Add(3 * time.Second)
	err = inTx(ctx, db, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, status) VALUES (?, 'UNPAID')", order3); err != nil {
			return err
		}
		_, err := client.Schedule(ctx, tx, delaybridge.Task{Topic: "order-expire", Key: order3, DueAt: due})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	show := func(id string) string {
		var status string
		if err := db.QueryRowContext(ctx, "SELECT status FROM orders WHERE id = ?", id).Scan(&status); err != nil {
			log.Fatal(err)
		}
		overdue, err := client.Overdue(ctx, db, "order-expire", id)
		if err != nil {
			log.Fatal(err)
		}
		if status == "UNPAID" && overdue {
			return "stored UNPAID, shown EXPIRED"
		}
		return "stored " + status + ", shown " + status
	}
	fmt.Println("before the cancel time:", show(order3))
	time.Sleep(time.Until(due.Add(200 * time.Millisecond))) // no handler runs in this example
	fmt.Println("after the cancel time: ", show(order3))
	// Output:
	// before the cancel time: stored UNPAID, shown UNPAID
	// after the cancel time:  stored UNPAID, shown EXPIRED
}

// Extending a deadline: a shipped order is confirmed automatically 7 days
// after shipping, and a buyer who asks for more time moves that task to
// 10 days, in the transaction that records the request. The task keeps its
// key; a message of its old due time that is already in the broker is
// skipped when it arrives (its generation is older). Reschedule needs no
// broker and no Start.
func ExampleClient_Reschedule() {
	ctx := context.Background()
	cfg, db := openOrders(ctx)
	defer db.Close()
	client, err := delaybridge.NewClient(db, cfg)
	if err != nil {
		log.Fatal(err)
	}
	order := fmt.Sprintf("order-4-%d", time.Now().UnixNano())
	shipped := time.Now()
	err = inTx(ctx, db, func(tx *sql.Tx) error {
		_, err := client.Schedule(ctx, tx, delaybridge.Task{Topic: "order-confirm", Key: order, DueAt: shipped.Add(7 * 24 * time.Hour)})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	err = inTx(ctx, db, func(tx *sql.Tx) error {
		// A task already handled (or cancelled) returns delaybridge.ErrFinished:
		// too late to extend.
		return client.Reschedule(ctx, tx, "order-confirm", order, shipped.Add(10*24*time.Hour))
	})
	if err != nil {
		log.Fatal(err)
	}
	info, err := client.Get(ctx, db, "order-confirm", order)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s, due %.0f days after shipping\n", info.State, info.Task.DueAt.Sub(shipped).Hours()/24)
	// Output:
	// pending, due 10 days after shipping
}

// The service that runs the handlers exports the consumer's series (its
// lateness, outcomes, retries and group sizes), which the dashboard in
// deploy/grafana and the alert rules in deploy/prometheus read; delaybridge
// run exports the relay's, the scanner's and the outbox's. Compiled, not
// run: it serves until the process ends.
func ExampleNewMetrics() {
	ctx := context.Background()
	cfg, db := openOrders(ctx)
	defer db.Close()
	reg := prometheus.NewRegistry()
	metrics, err := delaybridge.NewMetrics(reg)
	if err != nil {
		log.Fatal(err)
	}
	cfg.Metrics = metrics
	client, err := delaybridge.NewClient(db, cfg)
	if err != nil {
		log.Fatal(err)
	}
	// client.Handle(...), client.Start(ctx) as in Example.
	_ = client
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	log.Fatal(http.ListenAndServe("127.0.0.1:9466", nil))
}

// openOrders reads the settings, opens the database, creates or upgrades
// the outbox table and creates the orders table.
func openOrders(ctx context.Context) (delaybridge.Config, *sql.DB) {
	cfg, err := delaybridge.LoadConfig(nil) // DELAYBRIDGE_* and the config file
	if err != nil {
		log.Fatal(err)
	}
	db, err := cfg.OpenDB(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := delaybridge.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS orders (id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	return cfg, db
}

// inTx runs fn in a transaction and commits it, or rolls it back when fn
// fails.
func inTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
