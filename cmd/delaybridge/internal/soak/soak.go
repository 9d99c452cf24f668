// Package soak is delaybridge soak: the seeds' peak hour as an order
// service lives it. Orders are created at a rate, each scheduling its
// cancellation in its own transaction; some are paid, each payment
// cancelling the task in its transaction; `delaybridge run` relays in a
// process of its own, and this process consumes as the service would.
// It prints a line a minute and ends with a JSON summary.
package soak

import (
	"container/heap"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/console"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/percentile"
	"github.com/delaybridge/delaybridge/internal/scanner"
)

// Topic is the soak's cancellation topic.
const Topic = "soak-cancel"

// plainEvery: one order in this many also runs the same transactions
// without Schedule and Cancel, the yardstick beside them.
const plainEvery = 20

// Options are soak's flags.
type Options struct {
	rate      float64
	duration  time.Duration
	timeout   time.Duration
	payRatio  float64
	lastWin   time.Duration
	lastShare float64
	settle    time.Duration
	every     time.Duration
	workers   int
	asJSON    bool
	runArgs   []string
	waiting   int

	outageAt, outageFor     time.Duration
	outageStop, outageStart string
}

// Register adds soak's flags to f.
func (o *Options) Register(f *pflag.FlagSet) {
	f.Float64Var(&o.rate, "orders-rate", 200, "orders created a second")
	f.DurationVar(&o.duration, "duration", 2*time.Minute, "how long orders are created")
	f.DurationVar(&o.timeout, "timeout", time.Minute, "how long an order may stay unpaid: its cancel task's delay")
	f.Float64Var(&o.payRatio, "pay-ratio", 0.5, "share of orders paid before their timeout")
	f.DurationVar(&o.lastWin, "pay-last", 5*time.Second, "the last seconds before the timeout where late payments fall")
	f.Float64Var(&o.lastShare, "pay-last-share", 0.1, "share of payments that fall in --pay-last")
	f.DurationVar(&o.settle, "settle", 30*time.Second, "how long past the last timeout to wait for the cancellations")
	f.DurationVar(&o.every, "report-every", time.Minute, "how often to print a line")
	f.IntVar(&o.workers, "order-workers", 32, "concurrent order and payment transactions at most")
	f.BoolVar(&o.asJSON, "json", false, "end with one JSON object on the last line of stdout")
	f.StringArrayVar(&o.runArgs, "run-arg", nil, "pass this flag on to the delaybridge run process (repeatable)")
	f.IntVar(&o.waiting, "waiting", 0, "tasks loaded before the orders start, due after the soak ends")
	f.DurationVar(&o.outageAt, "outage-at", 0, "stop the broker this long after the start (0 = no outage)")
	f.DurationVar(&o.outageFor, "outage-for", 0, "start the broker again after this long")
	f.StringVar(&o.outageStop, "outage-stop", "", "shell command that stops the broker")
	f.StringVar(&o.outageStart, "outage-start", "", "shell command that starts the broker")
}

func (o *Options) check() error {
	switch {
	case !(o.rate > 0) || math.IsInf(o.rate, 0):
		return fmt.Errorf("--orders-rate %v: need a rate above 0", o.rate)
	case o.duration <= 0 || o.timeout <= 0 || o.settle < 0 || o.every <= 0:
		return fmt.Errorf("--duration, --timeout and --report-every must be positive, --settle 0 or more")
	case !(o.payRatio >= 0 && o.payRatio <= 1) || !(o.lastShare >= 0 && o.lastShare <= 1):
		return fmt.Errorf("--pay-ratio %v, --pay-last-share %v: need 0 to 1", o.payRatio, o.lastShare)
	case o.lastWin < 0 || o.lastWin >= o.timeout:
		return fmt.Errorf("--pay-last %v: need 0 or more and less than --timeout %v", o.lastWin, o.timeout)
	case o.waiting < 0:
		return fmt.Errorf("--waiting %d: need 0 or more", o.waiting)
	case o.workers < 1:
		return fmt.Errorf("--order-workers %d: need 1 or more", o.workers)
	case o.outageAt < 0 || o.outageFor < 0:
		return fmt.Errorf("--outage-at %v, --outage-for %v: need 0 or more", o.outageAt, o.outageFor)
	case o.outageAt > 0 && (o.outageFor == 0 || o.outageStop == "" || o.outageStart == ""):
		return fmt.Errorf("--outage-at needs --outage-for, --outage-stop and --outage-start")
	case o.outageAt > 0 && o.outageAt >= o.duration+o.timeout:
		return fmt.Errorf("--outage-at %v: need it before the last task is due, %v after the start", o.outageAt, o.duration+o.timeout)
	}
	return nil
}

// Env is what soak takes from the binary around it.
type Env struct {
	Log    *slog.Logger
	Stdout io.Writer
	Stderr io.Writer
	// Open opens the migrated database and the broker's clients.
	Open func(ctx context.Context) (*cli.Session, error)
	// ChildEnv is the environment of the processes soak starts: its own,
	// with the database and broker settings soak uses, so `delaybridge
	// run` and `status` work on the same ones (and no secret is on a
	// command line).
	ChildEnv func() []string
}

// Run runs the soak until it is done or ctx ends.
func Run(ctx context.Context, env Env, o *Options) error {
	if err := o.check(); err != nil {
		return err
	}
	ses, err := env.Open(ctx)
	if err != nil {
		return err
	}
	defer ses.Close()
	s := &soak{env: env, o: o, db: ses.DB, id: strconv.FormatInt(time.Now().UnixMilli(), 36), start: time.Now()}
	ses.DB.SetMaxOpenConns(o.workers + 24)
	ses.DB.SetMaxIdleConns(o.workers + 24)
	if err := s.setup(ctx); err != nil {
		return err
	}
	if err := s.loadWaiting(ctx); err != nil {
		return errors.Join(err, s.deleteWaiting(context.WithoutCancel(ctx)))
	}
	defer func() {
		if err := s.deleteWaiting(context.WithoutCancel(ctx)); err != nil {
			env.Log.Warn("soak: the waiting tasks stay", "topic", WaitingTopic, "err", err)
		}
	}()
	if err := ses.Clients.Ensure(ctx, Topic, broker.DefaultDeadTopic); err != nil {
		return err
	}
	stopRun, err := s.startRelay(ctx)
	if err != nil {
		return err
	}
	defer stopRun()
	c, err := outbox.NewConsumer(ses.DB, ses.Clients.Sub, ses.Clients.Pub, s.cancel, broker.ConsumerConfig{Logger: env.Log})
	if err != nil {
		return err
	}
	if err := c.Start(ctx, Topic); err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(cctx)
	}()
	return s.run(ctx)
}

type soak struct {
	env   Env
	o     *Options
	db    *sql.DB
	id    string
	start time.Time

	runPID   int
	httpAddr string
	procs    []proc
	// lastUsage is each watched process's CPU seconds at lastUsageAt.
	lastUsage   map[int]float64
	lastUsageAt time.Time

	created, paid, refused, cancelled, failed atomic.Int64

	pmu sync.Mutex
	due payments // the payments to make, soonest first

	mu     sync.Mutex
	minute *window // what the current report window saw
	// early counts the cancellations handled before their task was due:
	// none, if the runtime keeps its word.
	early atomic.Int64
	peak  *peak

	omu    sync.Mutex
	outage *outage
}

// window is one report's worth of samples (µs, lateness in ms).
type window struct {
	orderTx, plainOrderTx, rowOrderTx, payTx, plainPayTx, rowPayTx, lateness []int64
	created, paid, refused, cancelled                                        int64
}

// peak is what soak measured when most tasks were waiting.
type peak struct {
	Waiting    int64   `json:"waiting_tasks"`
	StatusMS   float64 `json:"status_ms"`
	MetricsMS  float64 `json:"metrics_scrape_ms"`
	OverviewMS float64 `json:"console_overview_ms"`
}

func (s *soak) setup(ctx context.Context) error {
	for _, q := range []string{
		`CREATE TABLE IF NOT EXISTS soak_orders (id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL,
  expire_ms BIGINT NOT NULL, paid_ms BIGINT NULL, cancelled_ms BIGINT NULL, effects INT NOT NULL DEFAULT 0) ENGINE = InnoDB`,
		`CREATE TABLE IF NOT EXISTS soak_plain (id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL) ENGINE = InnoDB`,
		`CREATE TABLE IF NOT EXISTS soak_plain_row (id VARCHAR(64) NOT NULL PRIMARY KEY, state VARCHAR(16) NOT NULL, due_ms BIGINT NOT NULL,
  KEY ix_soak_plain_row (state, due_ms)) ENGINE = InnoDB`,
		"DELETE FROM soak_orders", "DELETE FROM soak_plain", "DELETE FROM soak_plain_row",
	} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("soak: setup: %w", err)
		}
	}
	if _, err := s.db.ExecContext(ctx, "DELETE FROM delay_task WHERE topic = ?", Topic); err != nil {
		return fmt.Errorf("soak: setup: %w", err)
	}
	if err := s.deleteWaiting(ctx); err != nil {
		return err
	}
	s.minute = &window{}
	return nil
}

// startRelay starts `delaybridge run` as a process of its own, serving
// /metrics on a free loopback port, and returns what stops it.
func (s *soak) startRelay(ctx context.Context) (func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.httpAddr = ln.Addr().String()
	ln.Close()
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"run", "--http", s.httpAddr}
	args = append(args, s.o.runArgs...)
	log, err := os.CreateTemp("", "delaybridge-soak-run-*.log")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Env = s.env.ChildEnv()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("soak: start delaybridge run: %w", err)
	}
	s.runPID = cmd.Process.Pid
	fmt.Fprintf(s.env.Stderr, "soak: delaybridge run is pid %d, its log %s\n", s.runPID, log.Name())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Ready once it serves /readyz.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if r, err := http.Get("http://" + s.httpAddr + "/readyz"); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-exited:
			log.Close()
			return nil, fmt.Errorf("soak: delaybridge run exited: %v (its log: %s)", err, log.Name())
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("soak: delaybridge run not ready after 30 s (its log: %s)", log.Name())
		}
	}
	s.procs = append(servers(), proc{name: "relay (run)", pid: s.runPID}, proc{name: "service (soak)", pid: os.Getpid()})
	return func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(40 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		log.Close()
	}, nil
}

// cancel is the service's cancel handler: an order still unpaid is
// cancelled, once.
func (s *soak) cancel(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
	now := time.Now()
	res, err := tx.ExecContext(ctx, "UPDATE soak_orders SET status = 'CANCELLED', cancelled_ms = ?, effects = effects + 1 WHERE id = ? AND status = 'UNPAID'", now.UnixMilli(), m.Key)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		if now.Before(m.DeliverAt) {
			s.early.Add(1)
		}
		s.cancelled.Add(1)
		s.note(func(w *window) { w.cancelled++; w.lateness = append(w.lateness, now.Sub(m.DeliverAt).Milliseconds()) })
	}
	return nil
}

func (s *soak) note(f func(*window)) {
	s.mu.Lock()
	f(s.minute)
	s.mu.Unlock()
}

// payment is an order to pay at a time.
type payment struct {
	at    time.Time
	key   string
	plain bool
}

type payments []payment

func (p payments) Len() int           { return len(p) }
func (p payments) Less(i, j int) bool { return p[i].at.Before(p[j].at) }
func (p payments) Swap(i, j int)      { p[i], p[j] = p[j], p[i] }
func (p *payments) Push(x any)        { *p = append(*p, x.(payment)) }
func (p *payments) Pop() any {
	old := *p
	x := old[len(old)-1]
	*p = old[:len(old)-1]
	return x
}

// run creates the orders and their payments for --duration, reports each
// window, then waits for the last cancellations and reports the summary.
func (s *soak) run(ctx context.Context) error {
	o := s.o
	work := make(chan func(), o.workers)
	var wg sync.WaitGroup
	for range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				f()
			}
		}()
	}
	due := &s.due
	var reports []report
	// The soak's clock starts with its first order, after any load.
	s.start = time.Now()
	tick := time.NewTicker(o.every)
	defer tick.Stop()
	every := time.Duration(float64(time.Second) / o.rate)
	next := time.Now()
	end := s.start.Add(o.duration)
	lastExpire := end.Add(o.timeout)
	stopOutage := func() {}
	// ow is closed once the outage is measured: its backlog drained, or
	// it failed. With no outage there is nothing to wait for.
	ow := make(chan struct{})
	if o.outageAt == 0 {
		close(ow)
	} else {
		octx, cancel := context.WithCancel(ctx)
		go func() { defer close(ow); s.runOutage(octx) }()
		stopOutage = func() { cancel(); <-ow }
		defer stopOutage()
	}
	n := 0
	paceT := time.NewTimer(0)
	defer paceT.Stop()
	for {
		now := time.Now()
		if ctx.Err() != nil || now.After(lastExpire.Add(o.settle+drainWait)) {
			break
		}
		if now.After(lastExpire.Add(o.settle)) && closed(ow) {
			break
		}
		// Payments that are due go to the workers.
		s.pmu.Lock()
		for due.Len() > 0 && !(*due)[0].at.After(now) {
			p := heap.Pop(due).(payment)
			s.pmu.Unlock()
			if !s.submit(ctx, work, func() { s.pay(ctx, p) }) {
				break
			}
			s.pmu.Lock()
		}
		s.pmu.Unlock()
		select {
		case <-tick.C:
			reports = append(reports, s.report(ctx, now, len(reports)))
			if now.Before(end) && now.Add(o.every).After(end) {
				s.measurePeak(ctx)
			}
			continue
		default:
		}
		if now.Before(end) && !now.Before(next) {
			key := s.id + "-" + strconv.Itoa(n)
			plain := n%plainEvery == 0
			n++
			next = next.Add(every)
			var pay *payment
			if rand.Float64() < o.payRatio {
				pay = &payment{at: now.Add(s.payDelay()), key: key, plain: plain}
			}
			s.submit(ctx, work, func() { s.create(ctx, key, now, plain, pay) })
			continue
		}
		wait := 5 * time.Millisecond
		if now.Before(end) {
			wait = min(wait, time.Until(next))
		}
		paceT.Reset(max(wait, 0))
		select {
		case <-paceT.C:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	stopOutage()
	if s.peak == nil {
		s.measurePeak(ctx)
	}
	reports = append(reports, s.report(ctx, time.Now(), len(reports)))
	return s.summary(ctx, reports)
}

// drainWait is how long past --settle soak waits for an outage's backlog
// to drain before it checks the orders: a task still in it would count as
// lost.
const drainWait = 15 * time.Minute

// closed reports whether c is closed.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// submit hands f to a worker; false when ctx ended first.
func (s *soak) submit(ctx context.Context, work chan<- func(), f func()) bool {
	select {
	case work <- f:
		return true
	case <-ctx.Done():
		return false
	}
}

// payDelay is when after its creation an order is paid: for
// --pay-last-share of them within the last seconds, and up to a tenth of
// that past the timeout, where the payment races the cancellation (a
// channel's callback comes late); before that for the rest.
func (s *soak) payDelay() time.Duration {
	o := s.o
	if rand.Float64() < o.lastShare {
		return o.timeout - o.lastWin + time.Duration(rand.Int64N(int64(o.lastWin+o.lastWin/10)+1))
	}
	return time.Duration(rand.Int64N(int64(o.timeout - o.lastWin)))
}

// create is the order transaction: the order and its cancel task. Once
// it committed, pay (if not nil) is queued: no payment comes before its
// order exists.
func (s *soak) create(ctx context.Context, key string, now time.Time, plain bool, pay *payment) {
	took, err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO soak_orders (id, status, expire_ms) VALUES (?, 'UNPAID', ?)", key, now.Add(s.o.timeout).UnixMilli()); err != nil {
			return err
		}
		_, err := outbox.Schedule(ctx, tx, outbox.Task{Topic: Topic, Key: key, DueAt: now.Add(s.o.timeout)})
		return err
	})
	if err != nil {
		s.fail("order", err)
		return
	}
	s.created.Add(1)
	s.note(func(w *window) { w.created++; w.orderTx = append(w.orderTx, took) })
	if pay != nil {
		s.pmu.Lock()
		heap.Push(&s.due, *pay)
		s.pmu.Unlock()
	}
	if plain {
		order := func(tx *sql.Tx, id string) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO soak_plain (id, status) VALUES (?, 'UNPAID')", id)
			return err
		}
		s.yardsticks(ctx, key, order, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO soak_plain_row (id, state, due_ms) VALUES (?, 'pending', ?)", key, now.Add(s.o.timeout).UnixMilli())
			return err
		}, func(w *window) *[]int64 { return &w.plainOrderTx }, func(w *window) *[]int64 { return &w.rowOrderTx })
	}
}

// yardsticks times the business transaction biz alone on the row key,
// then on a row of its own with row, a bare indexed row written where
// Schedule or Cancel would write the task: the first is the cost without
// delaybridge, the second what any second row costs on this box. Their
// samples go where plain and withRow say.
func (s *soak) yardsticks(ctx context.Context, key string, biz func(*sql.Tx, string) error, row func(*sql.Tx) error, plain, withRow func(*window) *[]int64) {
	if took, err := s.tx(ctx, func(tx *sql.Tx) error { return biz(tx, key) }); err == nil {
		s.note(func(w *window) { *plain(w) = append(*plain(w), took) })
	}
	took, err := s.tx(ctx, func(tx *sql.Tx) error {
		if err := row(tx); err != nil {
			return err
		}
		return biz(tx, key+"/r")
	})
	if err == nil {
		s.note(func(w *window) { *withRow(w) = append(*withRow(w), took) })
	}
}

// errRefused: the cancellation won, the payment is refused.
var errRefused = errors.New("refused")

// pay is the payment transaction: it cancels the task first (the lock
// order Handle keeps), then marks the order paid; a task already done
// refuses the payment.
func (s *soak) pay(ctx context.Context, p payment) {
	took, err := s.tx(ctx, func(tx *sql.Tx) error {
		if err := outbox.Cancel(ctx, tx, Topic, p.key); err != nil {
			if errors.Is(err, outbox.ErrFinished) {
				return errRefused
			}
			return err
		}
		res, err := tx.ExecContext(ctx, "UPDATE soak_orders SET status = 'PAID', paid_ms = ? WHERE id = ? AND status = 'UNPAID'", time.Now().UnixMilli(), p.key)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errRefused
		}
		return nil
	})
	switch {
	case errors.Is(err, errRefused):
		s.refused.Add(1)
		s.note(func(w *window) { w.refused++ })
	case err != nil:
		s.fail("payment", err)
	default:
		s.paid.Add(1)
		s.note(func(w *window) { w.paid++; w.payTx = append(w.payTx, took) })
	}
	if p.plain {
		pay := func(tx *sql.Tx, id string) error {
			_, err := tx.ExecContext(ctx, "UPDATE soak_plain SET status = 'PAID' WHERE id = ? AND status = 'UNPAID'", id)
			return err
		}
		s.yardsticks(ctx, p.key, pay, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "UPDATE soak_plain_row SET state = 'cancelled' WHERE id = ? AND state = 'pending'", p.key)
			return err
		}, func(w *window) *[]int64 { return &w.plainPayTx }, func(w *window) *[]int64 { return &w.rowPayTx })
	}
}

// tx runs f in a transaction and returns how long it took, begin to
// commit, in µs.
func (s *soak) tx(ctx context.Context, f func(*sql.Tx) error) (int64, error) {
	start := time.Now()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return time.Since(start).Microseconds(), nil
}

func (s *soak) fail(what string, err error) {
	if s.failed.Add(1) <= 5 {
		s.env.Log.Warn("soak: transaction failed", "what", what, "err", err)
	}
}

// measurePeak times what an operator looks at, with the most tasks
// waiting: a `status`, a /metrics scrape of the relay, the console's
// overview.
func (s *soak) measurePeak(ctx context.Context) {
	p := &peak{Waiting: s.waiting()}
	self, _ := os.Executable()
	start := time.Now()
	cmd := exec.CommandContext(ctx, self, "status")
	cmd.Env = s.env.ChildEnv()
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Run(); err == nil {
		p.StatusMS = ms(time.Since(start))
	} else {
		p.StatusMS = -1
		s.env.Log.Warn("soak: status failed", "err", err)
	}
	start = time.Now()
	if r, err := http.Get("http://" + s.httpAddr + "/metrics"); err == nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		p.MetricsMS = ms(time.Since(start))
	} else {
		p.MetricsMS = -1
	}
	if took, err := console.TimeOverview(ctx, s.db, scanner.DefaultGrace); err == nil {
		p.OverviewMS = ms(took)
	} else {
		p.OverviewMS = -1
	}
	s.peak = p
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// waiting is the cancel tasks neither handled nor cancelled by a payment,
// and those --waiting loaded.
func (s *soak) waiting() int64 {
	return int64(s.o.waiting) + s.created.Load() - s.paid.Load() - s.cancelled.Load()
}

// report is one window's line.
type report struct {
	Window       int                `json:"window"`
	Created      int64              `json:"orders"`
	Paid         int64              `json:"paid"`
	Refused      int64              `json:"payments_refused"`
	Cancelled    int64              `json:"cancelled"`
	Waiting      int64              `json:"waiting_tasks"`
	Lateness     percentile.Summary `json:"lateness_ms"`
	OrderTx      percentile.Summary `json:"order_tx_us"`
	PlainOrderTx percentile.Summary `json:"order_tx_without_schedule_us"`
	RowOrderTx   percentile.Summary `json:"order_tx_with_a_bare_row_us"`
	PayTx        percentile.Summary `json:"payment_tx_us"`
	PlainPayTx   percentile.Summary `json:"payment_tx_without_cancel_us"`
	RowPayTx     percentile.Summary `json:"payment_tx_with_a_bare_row_us"`
	TableMiB     float64            `json:"delay_task_data_mib"`
	IndexMiB     float64            `json:"delay_task_index_mib"`
	Procs        []procUsage        `json:"processes"`
}

type procUsage struct {
	Name   string  `json:"name"`
	CPU    float64 `json:"cpu_cores"` // over the window
	RSSMiB float64 `json:"rss_mib"`
}

// report closes the current window and prints its line.
func (s *soak) report(ctx context.Context, now time.Time, i int) report {
	s.mu.Lock()
	w := s.minute
	s.minute = &window{}
	s.mu.Unlock()
	r := report{Window: i + 1, Created: w.created, Paid: w.paid, Refused: w.refused, Cancelled: w.cancelled, Waiting: s.waiting(),
		Lateness: percentile.Summarize(w.lateness), OrderTx: percentile.Summarize(w.orderTx), PlainOrderTx: percentile.Summarize(w.plainOrderTx),
		RowOrderTx: percentile.Summarize(w.rowOrderTx), PayTx: percentile.Summarize(w.payTx), PlainPayTx: percentile.Summarize(w.plainPayTx),
		RowPayTx: percentile.Summarize(w.rowPayTx)}
	var data, index sql.NullInt64
	_ = s.db.QueryRowContext(ctx, "SELECT data_length, index_length FROM information_schema.TABLES WHERE table_schema = DATABASE() AND table_name = 'delay_task'").Scan(&data, &index)
	r.TableMiB, r.IndexMiB = float64(data.Int64)/(1<<20), float64(index.Int64)/(1<<20)
	r.Procs = s.procUsage(now)
	fmt.Fprintf(s.env.Stderr, "%3d: orders %d, paid %d (refused %d), cancelled %d, waiting %d; lateness ms p50 %d p99 %d max %d; order tx p99 %.1f ms (%.1f without Schedule, %.1f with a bare row), payment p99 %.1f ms (%.1f without Cancel, %.1f with a bare row); delay_task %.0f+%.0f MiB;",
		r.Window, r.Created, r.Paid, r.Refused, r.Cancelled, r.Waiting, r.Lateness.P50, r.Lateness.P99, r.Lateness.Max,
		float64(r.OrderTx.P99)/1000, float64(r.PlainOrderTx.P99)/1000, float64(r.RowOrderTx.P99)/1000,
		float64(r.PayTx.P99)/1000, float64(r.PlainPayTx.P99)/1000, float64(r.RowPayTx.P99)/1000, r.TableMiB, r.IndexMiB)
	for _, p := range r.Procs {
		fmt.Fprintf(s.env.Stderr, " %s %.2f cores %.0f MiB;", p.Name, p.CPU, p.RSSMiB)
	}
	fmt.Fprintln(s.env.Stderr)
	return r
}

// procUsage returns each watched process's cores over the window since
// the last call and its memory now.
func (s *soak) procUsage(now time.Time) []procUsage {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []procUsage
	elapsed := now.Sub(s.lastUsageAt).Seconds()
	var restarted []proc // found again when a server is gone: an outage restarts it
	for i, p := range s.procs {
		cpu, rss, ok := usage(p.pid)
		if !ok {
			if restarted == nil {
				restarted = servers()
			}
			for _, r := range restarted {
				if r.name == p.name {
					s.procs[i].pid = r.pid
				}
			}
			continue
		}
		u := procUsage{Name: p.name, RSSMiB: rss}
		if prev, ok := s.lastUsage[p.pid]; ok && elapsed > 0 {
			u.CPU = (cpu - prev) / elapsed
		}
		if s.lastUsage == nil {
			s.lastUsage = map[int]float64{}
		}
		s.lastUsage[p.pid] = cpu
		out = append(out, u)
	}
	s.lastUsageAt = now
	return out
}

// summary checks the orders against the invariants and prints the JSON.
func (s *soak) summary(ctx context.Context, reports []report) error {
	var res struct {
		Orders     int64    `json:"orders"`
		Paid       int64    `json:"paid"`
		Refused    int64    `json:"payments_refused"`
		Cancelled  int64    `json:"cancelled"`
		Failed     int64    `json:"failed_transactions"`
		Lost       int64    `json:"lost"`
		DupEffects int64    `json:"dup_effects"`
		Early      int64    `json:"early"`
		PaidCancel int64    `json:"paid_yet_cancelled"`
		UnpaidDue  int64    `json:"unpaid_past_due"`
		Peak       *peak    `json:"peak"`
		Outage     *outage  `json:"outage,omitempty"`
		Windows    []report `json:"windows"`
	}
	res.Orders, res.Paid, res.Refused, res.Cancelled, res.Failed = s.created.Load(), s.paid.Load(), s.refused.Load(), s.cancelled.Load(), s.failed.Load()
	res.Peak, res.Windows = s.peak, reports
	s.omu.Lock()
	res.Outage = s.outage
	s.omu.Unlock()
	// An order past its expiry by more than the settle time that is
	// still unpaid lost its task (or the task is that late).
	cutoff := time.Now().Add(-s.o.settle).UnixMilli()
	for _, q := range []struct {
		dst   *int64
		where string
	}{
		{&res.DupEffects, "effects > 1"},
		{&res.Early, "cancelled_ms < expire_ms"},
		{&res.PaidCancel, "paid_ms IS NOT NULL AND cancelled_ms IS NOT NULL"},
		{&res.UnpaidDue, "status = 'UNPAID' AND expire_ms < " + strconv.FormatInt(cutoff, 10)},
	} {
		if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM soak_orders WHERE "+q.where).Scan(q.dst); err != nil {
			return err
		}
	}
	// The same cancellations seen two ways: by the handler, to the
	// microsecond, and by the rows, to the millisecond.
	res.Early = max(res.Early, s.early.Load())
	res.Lost = res.UnpaidDue
	fmt.Fprintf(s.env.Stdout, "soak: %d orders, %d paid (%d refused: the cancellation won), %d cancelled; lost %d, duplicate effects %d, early %d, paid yet cancelled %d, unpaid past due %d\n",
		res.Orders, res.Paid, res.Refused, res.Cancelled, res.Lost, res.DupEffects, res.Early, res.PaidCancel, res.UnpaidDue)
	if p := res.Peak; p != nil {
		fmt.Fprintf(s.env.Stdout, "at the peak, %d tasks waiting: status %.0f ms, /metrics %.0f ms, console overview %.0f ms\n", p.Waiting, p.StatusMS, p.MetricsMS, p.OverviewMS)
	}
	if o := res.Outage; o != nil {
		fmt.Fprintf(s.env.Stdout, "outage: broker down %.0f s from %.0f s; %d tasks overdue when it started; %s\n", o.DownS, o.StoppedS, o.Backlog, o.drained())
	}
	if s.o.asJSON {
		j, _ := json.Marshal(res)
		fmt.Fprintln(s.env.Stdout, string(j))
	}
	if res.Lost+res.DupEffects+res.Early+res.PaidCancel > 0 {
		return fmt.Errorf("soak: lost %d, duplicate effects %d, early %d, paid yet cancelled %d", res.Lost, res.DupEffects, res.Early, res.PaidCancel)
	}
	if res.Failed > 0 {
		return fmt.Errorf("soak: %d transactions failed (the first are logged)", res.Failed)
	}
	return nil
}
