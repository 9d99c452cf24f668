package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
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

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// flow is a scratch database with an orders table and the outbox.
type flow struct {
	db    *sql.DB
	dsn   string
	topic string
	ctx   context.Context

	mu       sync.Mutex
	handled  map[string]time.Time             // first successful Handle per key
	outcomes map[string][]outbox.HandleResult // every Handle that returned nil, per key
	runs     atomic.Int64
}

func newFlow(t testing.TB) *flow {
	t.Helper()
	db, dsn := testenv.ScratchDB(t)
	ctx := context.Background()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL,
  effects INT NOT NULL DEFAULT 0, paid INT NOT NULL DEFAULT 0) ENGINE = InnoDB`); err != nil {
		t.Fatal(err)
	}
	return &flow{db: db, dsn: dsn, ctx: ctx, topic: testenv.Name("flow"), handled: map[string]time.Time{},
		outcomes: map[string][]outbox.HandleResult{}}
}

// order writes an unpaid order and its cancellation task in one transaction.
func (f *flow) order(t testing.TB, id string, due time.Time) {
	t.Helper()
	if err := f.tryOrder(id, due); err != nil {
		t.Fatal(err)
	}
}

// tryOrder is order for a goroutine other than the test's: it returns the
// error.
func (f *flow) tryOrder(id string, due time.Time) error {
	tx, err := f.db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.Exec("INSERT INTO orders (id, status) VALUES (?, 'UNPAID')", id); err != nil {
		return err
	}
	if _, err := outbox.Schedule(f.ctx, tx, outbox.Task{Topic: f.topic, Key: id, DueAt: due}); err != nil {
		return err
	}
	return tx.Commit()
}

// handler cancels the order if unpaid, counting every applied effect, and
// fails the test when it runs before the task is due.
func (f *flow) handler(t testing.TB) broker.Handler {
	return func(ctx context.Context, m *broker.Message) error {
		now := time.Now()
		if now.Before(m.DeliverAt) {
			t.Errorf("%s handled %v early", m.Key, m.DeliverAt.Sub(now))
		}
		o, err := outbox.Handle(ctx, f.db, m, func(ctx context.Context, tx *sql.Tx) error {
			f.runs.Add(1)
			_, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'CANCELLED', effects = effects + 1 WHERE id = ? AND status = 'UNPAID'", m.Key)
			return err
		})
		if err == nil {
			f.mu.Lock()
			f.outcomes[m.Key] = append(f.outcomes[m.Key], o)
			if o == outbox.Handled {
				if _, dup := f.handled[m.Key]; dup {
					t.Errorf("%s handled twice", m.Key)
				}
				f.handled[m.Key] = now
			}
			f.mu.Unlock()
		}
		return err
	}
}

func (f *flow) consume(t testing.TB, pub broker.Publisher, sub broker.Subscriber) {
	t.Helper()
	c, err := broker.NewConsumer(sub, pub, f.handler(t), broker.ConsumerConfig{Logger: quiet(), Concurrency: 16,
		DeadLetter: outbox.DeadLetter(f.db, nil)})
	f.start(t, c, err)
}

// start starts c, made with err, on the flow's topic, and closes it when
// the test ends.
func (f *flow) start(t testing.TB, c *broker.Consumer, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(f.ctx, f.topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
}

// relay runs a relay that publishes every pending task at once (no
// lookahead), so a test sees tasks due later in the broker too.
func (f *flow) relay(t testing.TB, pub broker.Publisher) {
	t.Helper()
	r, err := outbox.NewRelay(f.db, pub, outbox.RelayConfig{Logger: quiet(), IdleMax: 50 * time.Millisecond, Lookahead: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (f *flow) count(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitDone waits until n tasks are done.
func (f *flow) waitDone(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	var done int
	if !testutil.Eventually(timeout, 100*time.Millisecond, func() bool {
		done = f.count(t, "SELECT COUNT(*) FROM delay_task WHERE state = 'done'")
		return done >= n
	}) {
		t.Fatalf("%d of %d tasks done after %v", done, n, timeout)
	}
}

// handledAt returns when key was first handled. The task turns done when
// Handle commits, a moment before the handler records the time, so it waits
// for the record.
func (f *flow) handledAt(t testing.TB, key string) time.Time {
	t.Helper()
	var at time.Time
	if !testutil.Eventually(5*time.Second, 10*time.Millisecond, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		at = f.handled[key]
		return !at.IsZero()
	}) {
		t.Fatalf("%s is done but its handler never recorded Handled", key)
	}
	return at
}

// checkOnce asserts every order's effect was applied exactly once.
func (f *flow) checkOnce(t testing.TB, n int) {
	t.Helper()
	if got := f.count(t, "SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED' AND effects = 1"); got != n {
		t.Fatalf("%d orders cancelled exactly once, want %d (duplicate effects: %d)", got, n,
			f.count(t, "SELECT COUNT(*) FROM orders WHERE effects > 1"))
	}
}

func TestFlow_EveryTaskHandledOnceNeverEarly(t *testing.T) {
	eachAdapter(t, func(t *testing.T, ad adapter) {
		f := newFlow(t)
		pub, sub := ad.open(t, f.topic)
		const n = 300
		start := time.Now()
		for i := range n {
			// Due between 1s and 8s: past the hop limit for the later ones.
			f.order(t, fmt.Sprintf("o-%d", i), start.Add(time.Second+time.Duration(i)*7*time.Second/n))
		}
		f.consume(t, pub, sub)
		// Two relays race over the same rows.
		f.relay(t, pub)
		f.relay(t, pub)
		f.waitDone(t, n, 60*time.Second)
		f.checkOnce(t, n)
	})
}

// dieAfterPublish closes the relay's own database pool once the broker
// confirmed, so the relay can record nothing more: a relay killed between
// the confirm and anything it could write after it.
type dieAfterPublish struct {
	broker.Publisher
	db *sql.DB
}

func (p dieAfterPublish) Publish(ctx context.Context, msgs ...*broker.Message) error {
	err := p.Publisher.Publish(ctx, msgs...)
	_ = p.db.Close()
	return err
}

// relayOnItsOwnPool returns a relay on a database pool of its own, which
// the publisher wrap makes from pub and that pool may close to kill it.
func (f *flow) relayOnItsOwnPool(t testing.TB, cfg outbox.RelayConfig, wrap func(own *sql.DB) broker.Publisher) *outbox.Relay {
	t.Helper()
	own, err := sql.Open("mysql", f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = own.Close() })
	cfg.Logger = quiet()
	r, err := outbox.NewRelay(own, wrap(own), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// dieBeforePublish closes the relay's own database pool and publishes
// nothing: a relay killed between its claim and its publish, the worst
// moment now that the claim marks its rows published.
type dieBeforePublish struct {
	broker.Publisher
	db *sql.DB
}

func (p dieBeforePublish) Publish(context.Context, ...*broker.Message) error {
	_ = p.db.Close()
	return errors.New("the relay died")
}

// A relay killed after the broker confirmed has nothing left to write:
// its claim recorded the hand-off. Every task is handled once.
func TestFlow_RelayKilledAfterTheConfirmHasNothingLeftToWrite(t *testing.T) {
	eachAdapter(t, func(t *testing.T, ad adapter) {
		f := newFlow(t)
		pub, sub := ad.open(t, f.topic)
		const n = 50
		for i := range n {
			f.order(t, fmt.Sprintf("k-%d", i), time.Now().Add(time.Second))
		}
		r := f.relayOnItsOwnPool(t, outbox.RelayConfig{}, func(own *sql.DB) broker.Publisher { return dieAfterPublish{pub, own} })
		if got, err := r.Once(f.ctx); err != nil || got != n {
			t.Fatalf("the relay killed after the confirm: Once = %d, %v; want %d and nothing left to record", got, err, n)
		}
		f.consume(t, pub, sub)
		f.waitDone(t, n, 60*time.Second)
		f.checkOnce(t, n)
	})
}

// A relay killed between its claim and its publish leaves its rows
// published with no message behind them. No relay takes them again; the
// scanner does, once the publish timeout past the claim and its grace are
// over, and every task is handled once, none early.
func TestFlow_RelayKilledAfterItsClaimLosesNothing(t *testing.T) {
	eachAdapter(t, func(t *testing.T, ad adapter) {
		f := newFlow(t)
		pub, sub := ad.open(t, f.topic)
		const n = 50
		var due time.Time
		for i := range n {
			due = time.Now().Add(time.Second)
			f.order(t, fmt.Sprintf("k-%d", i), due)
		}
		// All due, so one claim takes them whatever the relay's lookahead.
		time.Sleep(time.Until(due))
		r := f.relayOnItsOwnPool(t, outbox.RelayConfig{PublishTimeout: 2 * time.Second}, func(own *sql.DB) broker.Publisher { return dieBeforePublish{pub, own} })
		if _, err := r.Once(f.ctx); err == nil {
			t.Fatal("the killed relay reported success")
		}
		if got := f.count(t, "SELECT COUNT(*) FROM delay_task WHERE state = 'published' AND lease_owner <> 0"); got != n {
			rows, _ := f.db.Query("SELECT task_key, state, lease_owner, publish_attempts, COALESCE(last_error, '') FROM delay_task WHERE state <> 'published' OR lease_owner = 0")
			for rows != nil && rows.Next() {
				var k, st, le string
				var o, pa int64
				_ = rows.Scan(&k, &st, &o, &pa, &le)
				t.Logf("%s %s owner %d attempts %d %q", k, st, o, pa, le)
			}
			t.Fatalf("%d rows published under the dead relay's lease, want %d", got, n)
		}
		f.consume(t, pub, sub)
		f.relayAndScan(t, pub, outbox.RelayConfig{}, time.Second)
		f.waitDone(t, n, 60*time.Second)
		f.checkOnce(t, n)
	})
}

func TestFlow_RescheduleAfterPublishRunsAtTheNewTimeOnly(t *testing.T) {
	eachAdapter(t, func(t *testing.T, ad adapter) {
		f := newFlow(t)
		pub, sub := ad.open(t, f.topic)
		f.consume(t, pub, sub)
		f.relay(t, pub)
		f.order(t, "moved", time.Now().Add(2*time.Second))
		if !testutil.Eventually(10*time.Second, 20*time.Millisecond, func() bool {
			return f.count(t, "SELECT COUNT(*) FROM delay_task WHERE state = 'published'") > 0
		}) {
			t.Fatal("never published")
		}
		newDue := time.Now().Add(6 * time.Second)
		if err := outbox.Reschedule(f.ctx, f.db, f.topic, "moved", newDue); err != nil {
			t.Fatal(err)
		}
		f.waitDone(t, 1, 30*time.Second)
		at := f.handledAt(t, "moved")
		if at.Before(broker.MillisUTC(newDue)) {
			t.Fatalf("handled at %s, before the new due time %s: the old message ran", at.Format(time.StampMilli), newDue.Format(time.StampMilli))
		}
		f.checkOnce(t, 1)
	})
}

func TestFlow_PayRaceNeverCancelsAPaidOrder(t *testing.T) {
	eachAdapter(t, func(t *testing.T, ad adapter) {
		f := newFlow(t)
		pub, sub := ad.open(t, f.topic)
		f.consume(t, pub, sub)
		f.relay(t, pub)
		const n = 100
		due := time.Now().Add(2 * time.Second)
		for i := range n {
			f.order(t, fmt.Sprintf("p-%d", i), due)
		}
		// Pay every order at a moment spread around its due time.
		var wg sync.WaitGroup
		var paid, lost atomic.Int64
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Until(due.Add(time.Duration(i-n/2) * 4 * time.Millisecond)))
				tx, err := f.db.Begin()
				if err != nil {
					t.Error(err)
					return
				}
				defer tx.Rollback() //nolint:errcheck
				id := fmt.Sprintf("p-%d", i)
				// Only ErrFinished means the timeout won; a lock wait
				// timeout or a lost connection is a failure of the test.
				if err := outbox.Cancel(f.ctx, tx, f.topic, id); errors.Is(err, outbox.ErrFinished) {
					lost.Add(1)
					return
				} else if err != nil {
					t.Errorf("%s: Cancel: %v", id, err)
					return
				}
				res, err := tx.Exec("UPDATE orders SET status = 'PAID', paid = 1 WHERE id = ? AND status = 'UNPAID'", id)
				if err != nil {
					t.Errorf("%s: pay: %v", id, err)
					return
				}
				if k, _ := res.RowsAffected(); k != 1 {
					t.Errorf("%s: its task was cancellable but the order was no longer unpaid", id)
					return
				}
				if err := tx.Commit(); err != nil {
					t.Errorf("%s: commit: %v", id, err)
					return
				}
				paid.Add(1)
			}()
		}
		wg.Wait()
		if paid.Load()+lost.Load() != n {
			t.Fatalf("%d payments went through, %d lost to the timeout, of %d", paid.Load(), lost.Load(), n)
		}
		deadline := time.Now().Add(30 * time.Second)
		if !testutil.Eventually(30*time.Second, 100*time.Millisecond, func() bool {
			return f.count(t, "SELECT COUNT(*) FROM orders WHERE status = 'UNPAID'") == 0
		}) {
			t.Fatal("orders left unpaid past due")
		}
		// Wait for every published message to reach Handle, those of paid
		// orders included: they are the ones Handle must skip.
		infos := make(map[string]*outbox.TaskInfo, n)
		for i := range n {
			id := fmt.Sprintf("p-%d", i)
			if !testutil.Eventually(time.Until(deadline), 50*time.Millisecond, func() bool {
				f.mu.Lock()
				arrived := len(f.outcomes[id]) > 0
				f.mu.Unlock()
				info, err := outbox.Get(f.ctx, f.db, f.topic, id)
				if err != nil {
					t.Fatalf("%s: Get: %v", id, err)
				}
				infos[id] = info
				return arrived || info.PublishedAt.IsZero()
			}) {
				t.Fatalf("%s was published but its message never reached Handle", id)
			}
		}
		reached := 0 // paid orders whose message reached Handle
		f.mu.Lock()
		defer f.mu.Unlock()
		for id, info := range infos {
			var status string
			if err := f.db.QueryRow("SELECT status FROM orders WHERE id = ?", id).Scan(&status); err != nil {
				t.Fatal(err)
			}
			handled := 0
			for _, o := range f.outcomes[id] {
				if o == outbox.Handled {
					handled++
				}
			}
			if status == "PAID" && len(f.outcomes[id]) > 0 {
				reached++
			}
			switch {
			case status == "PAID" && (info.State != outbox.StateCancelled || handled != 0):
				t.Errorf("%s is paid but its task is %s and the timeout ran %d times (outcomes %v)", id, info.State, handled, f.outcomes[id])
			case status == "CANCELLED" && (info.State != outbox.StateDone || handled != 1):
				t.Errorf("%s was cancelled by the timeout but its task is %s, handled %d times (outcomes %v)", id, info.State, handled, f.outcomes[id])
			case status != "PAID" && status != "CANCELLED":
				t.Errorf("%s is %s", id, status)
			}
		}
		if got := f.count(t, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"); int64(got) != paid.Load() {
			t.Fatalf("%d orders PAID, %d payments went through", got, paid.Load())
		}
		// Without a paid order whose message reached Handle afterwards, the
		// race never tested Handle's cancelled check.
		if reached == 0 {
			t.Fatalf("no message of a paid order reached Handle: the race did not happen (%d paid)", paid.Load())
		}
		t.Logf("%s: %d paid (%d of their messages reached Handle), %d cancelled by the timeout", ad.name, paid.Load(), reached, lost.Load())
	})
}

// rescueLog records when each task's re-publish started, for the
// re-publishes the broker confirmed: the scanners' rescues. It holds each
// publish for hold first, so that every claim stays open across a pass of
// the other scanner, however fast the broker confirms: only the claim's
// lease then keeps that pass from taking the same tasks.
type rescueLog struct {
	broker.Publisher
	hold time.Duration
	mu   sync.Mutex
	at   map[int64][]time.Time
}

func (p *rescueLog) Publish(ctx context.Context, msgs ...*broker.Message) error {
	start := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(p.hold):
	}
	err := p.Publisher.Publish(ctx, msgs...)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, res := range broker.PublishResults(err, len(msgs)) {
		if res == nil {
			p.at[msgs[i].TaskID] = append(p.at[msgs[i].TaskID], start)
		}
	}
	return err
}

func TestScanner_RescuesEveryTaskTheBrokerLost(t *testing.T) {
	eachAdapter(t, func(t *testing.T, ad adapter) {
		f := newFlow(t)
		pub, sub := ad.open(t, f.topic)
		const n = 100
		due := time.Now().Add(1500 * time.Millisecond)
		for i := range n {
			f.order(t, fmt.Sprintf("l-%d", i), due)
		}
		// Publish them all with no consumer running.
		r, err := outbox.NewRelay(f.db, pub, outbox.RelayConfig{Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		for f.count(t, "SELECT COUNT(*) FROM delay_task WHERE state = 'pending'") > 0 {
			if _, err := r.Once(f.ctx); err != nil {
				t.Fatal(err)
			}
		}
		// Let the broker's timers fire, then destroy every copy.
		time.Sleep(time.Until(due.Add(2 * time.Second)))
		ad.lose(t, f.topic)

		f.consume(t, pub, sub)
		const grace, interval = time.Second, 200 * time.Millisecond
		var rescued atomic.Int64
		rescues := &rescueLog{Publisher: pub, hold: 2 * interval, at: map[int64][]time.Time{}}
		var stops []func()
		for range 2 {
			sc, err := scanner.New(f.db, rescues, scanner.Config{Logger: quiet(), Grace: grace, Interval: interval,
				Hooks: scanner.Hooks{Rescued: func(k int) { rescued.Add(int64(k)) }}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(f.ctx)
			done := make(chan struct{})
			go func() { _ = sc.Run(ctx); close(done) }()
			stop := sync.OnceFunc(func() { cancel(); <-done })
			stops = append(stops, stop)
			t.Cleanup(stop)
		}
		f.waitDone(t, n, 60*time.Second)
		f.checkOnce(t, n)
		// The hook runs after the rescue is recorded, and a consumer may
		// finish the tasks before the scanner gets there: stopped, the
		// scanners have recorded and reported every rescue they made.
		for _, stop := range stops {
			stop()
		}
		// Everything was lost, so every task must have been rescued. A
		// handler slow to commit (a stalled fsync on a loaded box) leaves
		// its task open past the grace after its rescue, and then it is
		// rightly rescued again, so the total is not pinned to n.
		if got := f.count(t, "SELECT COUNT(*) FROM delay_task WHERE rescues = 0"); got != 0 {
			t.Fatalf("%d of %d lost tasks never rescued", got, n)
		}
		total := f.count(t, "SELECT COALESCE(SUM(rescues), 0) FROM delay_task")
		if int64(total) != rescued.Load() {
			t.Fatalf("rescue count %d on the rows, %d reported: a rescue went unrecorded on its row", total, rescued.Load())
		}
		// A rescue counts its grace from the stamp of the previous one, set
		// after that publish returned, and doubles it after each: the k-th
		// rescue of a task starts its publish at least grace × 2^(k-2)
		// after the one before, however slow the box. Two rescues closer
		// than that are two scanners that claimed the same task in the
		// same pass, or a backoff not kept. The 50 ms allow for the rows'
		// wall-clock milliseconds.
		again := 0
		rescues.mu.Lock()
		defer rescues.mu.Unlock()
		for id, at := range rescues.at {
			for k := 1; k < len(at); k++ {
				again++
				if gap, least := at[k].Sub(at[k-1]), grace<<(k-1)-50*time.Millisecond; gap < least {
					t.Errorf("task %d: rescue %d started %v after the one before, want at least %v: rescued again too soon", id, k+1, gap, least)
				}
			}
		}
		t.Logf("%d rescues of %d lost tasks (%d again, after the grace)", total, n, again)
	})
}
