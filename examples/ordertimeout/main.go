// Command ordertimeout is an order service with timeout auto-cancel on
// delaybridge, end to end: it creates orders, each reserving stock and
// scheduling its own cancellation in the same transaction; pays some at
// once, some too late (refunded by a task of their own) and some through
// a payment still in flight at the cancel time (the timeout snoozes until
// the channel answers); reads every order through the lazy check, which
// cancels an expired one at once; lets the rest expire; and exits 0 only
// when the invariants hold: no order is both paid and cancelled, none
// stays unpaid past its cancel time, none is cancelled before it, every
// payment in flight ends paid, every refused payment is refunded once, no
// read showed UNPAID after the cancel time, and the stock adds up.
//
// It reads the delaybridge settings as the daemon does (flags,
// DELAYBRIDGE_*, --config) and runs the relay and the scanner in its own
// process, so it needs nothing but the services:
//
//	eval "$(scripts/services.sh env)"   # or export the DELAYBRIDGE_* of your own
//	go run ./examples/ordertimeout --broker rabbit
//	go run ./examples/ordertimeout --broker rocket
//
// It replaces the demo_orders, demo_inventory and demo_refunds tables and
// its topics' tasks in the configured database.
//
// Its order service, orders.go, makes every delaybridge call through the
// Client inside the order's own transaction: copy it to start a service of
// your own.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge"
	// The adapters --broker may name.
	_ "github.com/delaybridge/delaybridge/rabbit"
	_ "github.com/delaybridge/delaybridge/rocket"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "ordertimeout:", err)
		os.Exit(1)
	}
}

// options are the program's own flags.
type options struct {
	orders  int
	timeout time.Duration
	wait    time.Duration
	verbose bool
}

// run is the program: main without the process around it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o options
	cfg := delaybridge.DefaultConfig()
	fs := pflag.NewFlagSet("ordertimeout", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.orders, "orders", 40, "orders to create")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Second, "how long an order may stay unpaid")
	fs.DurationVar(&o.wait, "wait", 30*time.Second, "how long past the last cancel time to wait for every order to settle")
	fs.BoolVar(&o.verbose, "verbose", false, "log what delaybridge does")
	fs.String("config", "", "config file of name = value lines (env DELAYBRIDGE_CONFIG)")
	cfg.RegisterFlags(fs)
	// This program creates its RocketMQ topic, as the local broker allows:
	// the flag's default becomes true.
	create := fs.Lookup("rocketmq-create-topics")
	create.DefValue = "true"
	_ = create.Value.Set("true")
	if err := delaybridge.LoadFlags(fs, args, "ordertimeout"); err != nil {
		return err
	}
	if o.orders < 4 || o.timeout <= 0 {
		return errors.New("need --orders >= 4 and --timeout > 0")
	}
	if err := cfg.Check(); err != nil {
		return err
	}
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	db, err := cfg.OpenDB(ctx)
	if err != nil {
		return fmt.Errorf("%w (for the local services: eval \"$(scripts/services.sh env)\")", err)
	}
	defer db.Close()
	if _, err := delaybridge.Migrate(ctx, db); err != nil {
		return err
	}
	svc := &orderService{db: db, timeout: o.timeout, channel: &paymentChannel{}, recheck: 500 * time.Millisecond}
	// The relay and the scanner run in this process; a service deployed
	// next to delaybridge run leaves both nil. The scanner also cancels
	// orders left unpaid whatever became of their task.
	cfg.Relay = &delaybridge.RelayConfig{IdleMax: 100 * time.Millisecond}
	cfg.Scanner = &delaybridge.ScannerConfig{Grace: 5 * time.Second, Interval: 500 * time.Millisecond,
		Business: &delaybridge.BusinessSource{Name: "unpaid-orders", Every: 2 * time.Second, Query: svc.unpaidPastDue(10 * time.Second), Handle: svc.cancelIfUnpaid}}
	client, err := delaybridge.NewClient(db, cfg)
	if err != nil {
		return err
	}
	svc.client = client
	if err := svc.setup(ctx, []string{"sku-a", "sku-b"}, 1000); err != nil {
		return err
	}
	if err := client.Handle(topic, svc.cancelTask); err != nil {
		return err
	}
	if err := client.Handle(refundTopic, svc.refundTask); err != nil {
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
	fmt.Fprintf(stdout, "ordertimeout: %d orders on %s (%s), timeout %v\n", o.orders, client.Broker().Name(), client.Broker().Mode(), o.timeout)
	return story(ctx, svc, o, stdout)
}

// story creates the orders, pays some in time and some too late, reads
// them all through the lazy check, waits for the rest to expire and checks
// the invariants.
func story(ctx context.Context, svc *orderService, o options, stdout io.Writer) error {
	ids := make([]string, o.orders)
	prefix := fmt.Sprintf("order-%d", time.Now().UnixMilli())
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
		if err := svc.createOrder(ctx, ids[i], []string{"sku-a", "sku-b"}[i%2], 1+i%3); err != nil {
			return err
		}
	}
	created := time.Now()
	// Every order's cancel time is at or before this one.
	cancelTime := created.Add(o.timeout)
	var (
		mu                        sync.Mutex
		paid, late, refused       int
		inFlight, callbacksPaid   int
		shownStale                []string
		shownExpired, readCancels int
		wg                        sync.WaitGroup
		errs                      []error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}
	// Every fourth order is paid at once. Every fourth is paid after its
	// cancel time: that payment is refused (the order is cancelled or
	// shown EXPIRED) and refunded. Every fourth starts a payment in time
	// whose callback comes only after the cancel time: the timeout snoozes
	// while the channel says pending, and the order ends paid. The rest
	// are never paid.
	callbackAt := cancelTime.Add(3 * time.Second)
	for i, id := range ids {
		switch i % 4 {
		case 0:
			ok, err := svc.pay(ctx, id)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("order %s: paying at once failed", id)
			}
			paid++
		case 1:
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Until(cancelTime.Add(500 * time.Millisecond)))
				ok, err := svc.pay(ctx, id)
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if ok {
					late++
				} else {
					refused++
				}
			}()
		case 2:
			ok, err := svc.startPayment(ctx, id)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("order %s: starting a payment in time failed", id)
			}
			inFlight++
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Until(callbackAt))
				ok, err := svc.pay(ctx, id)
				if err != nil {
					// The payment stays pending at the channel: the
					// timeout keeps waiting for it.
					fail(err)
					return
				}
				svc.channel.settled(id)
				mu.Lock()
				defer mu.Unlock()
				if ok {
					callbacksPaid++
				}
			}()
		}
	}
	// Readers poll every order until all settled; after the cancel time
	// none may show UNPAID.
	readers, stopReading := context.WithCancel(ctx)
	defer stopReading()
	var rg sync.WaitGroup
	rg.Add(1)
	go func() {
		defer rg.Done()
		for readers.Err() == nil {
			for _, id := range ids {
				checkedAfter := time.Now().After(cancelTime)
				status, cancelled, err := svc.show(ctx, id)
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				switch {
				case status == "UNPAID" && checkedAfter:
					shownStale = append(shownStale, id)
				case status == "EXPIRED":
					shownExpired++
				}
				if cancelled {
					readCancels++
				}
				mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	wg.Wait()
	mu.Lock()
	refunds := refused
	mu.Unlock()
	if err := svc.waitSettled(ctx, cancelTime.Add(o.wait), refunds); err != nil {
		return err
	}
	stopReading()
	rg.Wait()
	r, err := svc.check(ctx)
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Fprintf(stdout, "orders %d: paid %d (%d at once, %d after a payment in flight, %d after the cancel time), cancelled %d (by timeout %d, by a read %d, by scanner %d)\n",
		r.orders, r.paid, paid, callbacksPaid, late, r.cancelled, r.cancelledBy["timeout"], r.cancelledBy["read"], r.cancelledBy["scanner"])
	fmt.Fprintf(stdout, "paid and cancelled: %d; unpaid past the cancel time: %d; cancelled early: %d; stock consistent: %v\n",
		r.wronglyCancelled, r.leftUnpaid, r.early, r.stockOK)
	fmt.Fprintf(stdout, "payments in flight at the cancel time: %d, their timeouts snoozed: %d; late payments refunded: %d of %d\n",
		inFlight, r.snoozed, r.refunds, refused)
	fmt.Fprintf(stdout, "reads: shown EXPIRED by the lazy check %d times, cancelled by a read %d times, shown UNPAID after the cancel time %d times\n",
		shownExpired, readCancels, len(shownStale))
	fmt.Fprintf(stdout, "cancellation lateness: p50 %dms p99 %dms max %dms\n", r.p50, r.p99, r.max)
	var broken []error
	broken = append(broken, errs...)
	if r.wronglyCancelled != 0 || r.leftUnpaid != 0 || r.early != 0 || !r.stockOK {
		broken = append(broken, errors.New("an order invariant is broken"))
	}
	if r.paid != paid+callbacksPaid+late || r.paid+r.cancelled != r.orders {
		broken = append(broken, fmt.Errorf("%d orders paid, %d payments went through; %d of %d settled", r.paid, paid+callbacksPaid+late, r.paid+r.cancelled, r.orders))
	}
	if callbacksPaid != inFlight {
		broken = append(broken, fmt.Errorf("%d of %d payments in flight at the cancel time were refused: the timeout did not wait for them", inFlight-callbacksPaid, inFlight))
	}
	if inFlight > 0 && r.snoozed == 0 {
		broken = append(broken, errors.New("no timeout snoozed for a payment in flight"))
	}
	if r.refunds != refused || r.refundedPaid != 0 {
		broken = append(broken, fmt.Errorf("%d refunds for %d refused payments, %d of them of a paid order", r.refunds, refused, r.refundedPaid))
	}
	if late != 0 {
		broken = append(broken, fmt.Errorf("%d payments after the cancel time went through", late))
	}
	if len(shownStale) > 0 {
		broken = append(broken, fmt.Errorf("%d reads showed UNPAID after the cancel time (first %s)", len(shownStale), shownStale[0]))
	}
	if err := errors.Join(broken...); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "ordertimeout: every invariant holds")
	return nil
}
