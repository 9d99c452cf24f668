package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/driver"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/percentile"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"log/slog"
)

// Env is what the bench takes from the binary around it. Every field is
// required.
type Env struct {
	Log    *slog.Logger
	Stdout io.Writer
	Stderr io.Writer
	// Broker returns the broker settings (--broker and the rest), with Log
	// as their logger, as Open left them.
	Broker func() driver.Settings
	// Lookahead turns --lookahead, as set on fs, into the relay's
	// lookahead, by run's rule.
	Lookahead func(fs *pflag.FlagSet, v time.Duration) (time.Duration, error)
	// ListenMetrics listens on --http; a nil listener when addr is empty.
	ListenMetrics func(addr string) (net.Listener, error)
	// Open opens the database, migrated (the development database without
	// --mysql-dsn), and the broker with a subscriber.
	Open func(ctx context.Context) (*cli.Session, error)
	// Metrics returns the metrics of a run on db, served on ln unless ln is
	// nil, with the broker at brokerAddr; stop stops serving them.
	Metrics func(ln net.Listener, db *sql.DB, brokerAddr string) (m *delaybridge.Metrics, stop func())
}

// Run runs the bench o describes, its flags set on fs, until it is done,
// ctx ends, or SIGINT or SIGTERM arrives.
func Run(ctx context.Context, env Env, o *Options, fs *pflag.FlagSet) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// The flags first: a refused run creates no profile file and
	// truncates none.
	ahead, err := o.check(fs, env.Lookahead)
	if err != nil {
		return err
	}
	ln, err := env.ListenMetrics(o.httpAddr)
	if err != nil {
		return err
	}
	if ln != nil {
		defer ln.Close()
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	b := &benchSession{env: env, o: o, ahead: ahead, httpLn: ln}
	defer b.close()
	return b.execute(ctx)
}

// benchSession is one bench run: its database, broker, consumer, relay and
// the tasks it tracks.
type benchSession struct {
	env   Env
	o     *Options
	ahead time.Duration // the relay's lookahead setting
	// httpLn is where --http serves /metrics, nil when off: listened on
	// before the session touches the database.
	httpLn net.Listener
	// inProcess: cl is the in-process broker (--database-only, or the
	// floor's run); floorRun: this is the floor's run, reported in a line.
	inProcess, floorRun bool

	db       *sql.DB
	cl       *cli.Clients
	m        *delaybridge.Metrics
	tasks    *benchRun
	res      benchResult
	consumer *broker.Consumer
	relay    *outbox.Relay
	closers  []func()
	// tracing is on with --trace: the spans a traced service makes.
	tracing broker.Tracing
	// trickle is --trickle's topic, nil without it; trickleStart is when
	// it started.
	trickle      *trickle
	trickleStart time.Time

	scheduleStart time.Time
}

// close releases what the session opened, last first.
func (b *benchSession) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

func (b *benchSession) execute(ctx context.Context) error {
	if err := b.open(ctx); err != nil {
		return err
	}
	var floorErr error
	if b.o.floor {
		floor, err := b.runFloor(ctx)
		if err != nil {
			// A floor that lost or ran a task early still measured
			// something: report it beside the broker run, and fail after.
			if ctx.Err() != nil {
				return err
			}
			floorErr = fmt.Errorf("floor: %w", err)
		}
		b.res.Floor = floor
	}
	return errors.Join(floorErr, b.run(ctx))
}

// runFloor runs the workload through the in-process broker, with the
// broker's lookahead, on the session's database and metrics, and returns
// its result; the broker's clients stay open, idle, for the run after it.
func (b *benchSession) runFloor(ctx context.Context) (*benchResult, error) {
	f := &benchSession{env: b.env, o: b.o, ahead: b.ahead, db: b.db, m: b.m, inProcess: true, floorRun: true}
	f.cl = inProcessClients(b.cl.Pub.Limits().Lookahead)
	f.closers = append(f.closers, f.cl.Close)
	defer f.close()
	err := f.run(ctx)
	return &f.res, err
}

// run is one run of the workload through b.cl: schedule, relay, consume,
// report.
func (b *benchSession) run(ctx context.Context) error {
	o := b.o
	floor := b.res.Floor
	b.tasks = &benchRun{id: strconv.FormatInt(time.Now().UnixMilli(), 36), topic: o.topic, due: make([]int64, o.tasks),
		handled: make([]atomic.Int64, o.tasks), runs: make([]atomic.Int32, o.tasks), committed: make([]atomic.Int64, o.tasks),
		published: make([]atomic.Int64, o.tasks), delivered: make([]atomic.Int64, o.tasks)}
	b.res = benchResult{Broker: b.env.Broker().Broker, Mode: b.env.Broker().Mode(), Tasks: o.tasks, HandlerMode: o.handler, Floor: floor}
	if b.inProcess {
		b.res.Mode = "database only, " + b.env.Broker().Broker + "'s lookahead"
	}
	if o.trace {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(dropSpans{}))
		b.closers = append(b.closers, func() { _ = tp.Shutdown(context.Background()) })
		b.tracing = broker.NewTracing(tp, b.env.Broker().Broker)
		b.res.Tracing = true
	}
	if o.trickle > 0 && !b.floorRun {
		b.trickle = newTrickle(b.db, o.trickleTopic(), o.trickle, o.trickleDelay)
	}
	if err := b.startConsumer(ctx); err != nil {
		return err
	}
	if o.baseline && !b.floorRun {
		var err error
		// Labelled, like the relay below, so a --cpuprofile tells the
		// phases apart (go tool pprof -tagfocus phase=baseline).
		pprof.Do(ctx, pprof.Labels("phase", "baseline"), func(ctx context.Context) { err = b.measureBaseline(ctx) })
		if err != nil {
			return err
		}
	}
	if err := b.newRelay(); err != nil {
		return err
	}
	work, stopWork := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer func() { stopWork(); bg.Wait() }()
	relayStart := time.Now()
	startRelay := func() {
		relayStart = time.Now()
		bg.Add(1)
		go pprof.Do(work, pprof.Labels("phase", "relay"), func(ctx context.Context) { defer bg.Done(); _ = b.relay.Run(ctx) })
	}
	if !o.preload {
		startRelay()
	}
	prog := newProgress(b.env.Stderr, o.tasks)
	bg.Add(1)
	go func() { defer bg.Done(); prog.loop(work, b.tasks) }()
	var commits []int64
	var commitErr error
	commitsDone := make(chan struct{})
	if o.rate > 0 && !o.relayOnly {
		go func() { defer close(commitsDone); commits, commitErr = sampleCommits(work, b.db) }()
	} else {
		close(commitsDone)
	}
	trickling, stopTrickle := context.WithCancel(work)
	defer stopTrickle()
	if b.trickle != nil {
		nudge := b.relay.Nudge
		if o.noNudge {
			nudge = nil
		}
		b.trickleStart = time.Now()
		bg.Add(1)
		go func() { defer bg.Done(); b.trickle.run(trickling, nudge) }()
		fmt.Fprintf(b.env.Stderr, "trickle: %v a second to %s, alone for %v\n", o.trickle, o.trickleTopic(), o.trickleIdle)
		select {
		case <-time.After(o.trickleIdle):
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	if err := b.schedule(ctx); err != nil {
		return err
	}
	if o.preload {
		startRelay()
	}
	// Relay throughput: until every scheduled task left pending.
	for b.tasks.relayed.Load() < b.res.Scheduled && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	b.res.RelayTPS = float64(b.res.Scheduled) / time.Since(relayStart).Seconds()
	b.res.RelayStartMS, b.res.RelayEndMS = relayStart.UnixMilli(), time.Now().UnixMilli()
	if o.relayOnly {
		stopWork()
		return b.reportRelayOnly()
	}
	b.waitForHandlers(ctx)
	if b.trickle != nil {
		stopTrickle()
		b.trickle.wait(ctx, time.Now().Add(o.trickleDelay).Add(o.wait))
	}
	stopWork()
	<-commitsDone
	if commitErr != nil {
		return commitErr
	}
	if len(commits) > 0 {
		c := percentile.Summarize(commits)
		b.res.CommitLatency = map[string]int64{"p50": c.P50, "p90": c.P90, "p99": c.P99, "max": c.Max, "samples": int64(len(commits))}
	}
	prog.done(b.tasks)
	return b.report()
}

// open connects to the database (migrated, bench tables emptied) and the
// broker, and serves metrics when asked.
func (b *benchSession) open(ctx context.Context) error {
	o := b.o
	ses, err := b.env.Open(ctx)
	if err != nil {
		return err
	}
	b.closers = append(b.closers, ses.Close)
	db := ses.DB
	b.db = db
	workers := o.concurrent
	if workers == 0 {
		workers = broker.DefaultConcurrencyFor(runtime.GOMAXPROCS(0))
	}
	relayWorkers := o.relayWkrs
	if relayWorkers == 0 {
		relayWorkers = max(ses.Clients.Pub.Limits().RelayWorkers, outbox.DefaultWorkers)
	}
	conns := o.producers + relayWorkers + workers + 8
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS bench_orders (
  id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL, effects INT NOT NULL DEFAULT 0) ENGINE = InnoDB`); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM bench_orders"); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM delay_task WHERE topic IN (?, ?)", o.topic, o.trickleTopic()); err != nil {
		return err
	}
	if o.dbOnly {
		lookahead := ses.Clients.Pub.Limits().Lookahead
		ses.Clients.Close()
		ses.Clients = inProcessClients(lookahead)
		b.inProcess = true
	}
	cl := ses.Clients
	b.cl = cl
	m, stop := b.env.Metrics(b.httpLn, db, cl.Addr)
	b.m = m
	b.closers = append(b.closers, stop)
	return nil
}

// inProcessClients returns the in-process broker --database-only and
// --floor run with, advising lookahead as the broker --broker chose does.
func inProcessClients(lookahead time.Duration) *cli.Clients {
	mem := memory.New(memory.Config{Limits: broker.Limits{Lookahead: lookahead}, Prefetch: 30000})
	return &cli.Clients{Pub: mem, Sub: mem, Close: func() { _ = mem.Close() },
		Ensure: func(context.Context, ...string) error { return nil }}
}

// startConsumer builds the consumer of the chosen handler and, unless only
// the relay is measured, starts it.
func (b *benchSession) startConsumer(ctx context.Context) error {
	o, run := b.o, b.tasks
	hooks := b.m.ConsumerHooks()
	grouped := hooks.Grouped
	hooks.Grouped = func(topic string, n int, took time.Duration) {
		run.groups.Add(1)
		run.grouped.Add(int64(n))
		run.groupMicros.Add(took.Microseconds())
		grouped(topic, n, took)
	}
	ccfg := broker.WithTracing(broker.ConsumerConfig{Concurrency: o.concurrent, Logger: b.env.Log, Hooks: hooks, GroupSize: o.group}, b.tracing)
	if o.topicRate > 0 {
		ccfg.Topics = map[string]broker.TopicPolicy{o.topic: {Rate: o.topicRate}}
	}
	// The runtime's hold window with ccfg's HoldWindow unset: a message
	// earlier than that goes on another hop.
	sub := deliveryClock{b.cl.Sub, run, b.trickle, max(broker.DefaultHoldWindow, 2*b.cl.Pub.Limits().Precision)}
	var err error
	if o.handler == "noop" {
		b.consumer, err = broker.NewConsumer(sub, b.cl.Pub, func(ctx context.Context, m *broker.Message) error {
			if i, ok := run.index(m.Key); ok {
				run.seen(i, time.Now())
			} else if b.trickle != nil {
				b.trickle.seen(m.Key, time.Now())
			}
			return nil
		}, ccfg)
	} else {
		// The order-timeout handler as users write it, one message at a
		// time; outbox.NewConsumer runs the messages due together in
		// shared transactions.
		b.consumer, err = outbox.NewConsumer(b.db, sub, b.cl.Pub, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
			i, ok := run.index(m.Key)
			if !ok && (b.trickle == nil || m.Topic != b.trickle.topic) {
				return nil
			}
			now := time.Now()
			if _, err := tx.ExecContext(ctx, "UPDATE bench_orders SET status = 'CANCELLED', effects = effects + 1 WHERE id = ? AND status = 'UNPAID'", m.Key); err != nil {
				return err
			}
			if ok {
				run.seen(i, now)
			} else {
				b.trickle.seen(m.Key, now)
			}
			return nil
		}, ccfg)
	}
	if err != nil {
		return err
	}
	topics := []string{o.topic}
	if b.trickle != nil {
		topics = append(topics, b.trickle.topic)
	}
	if err := b.cl.Ensure(ctx, append(topics, broker.DefaultDeadTopic)...); err != nil {
		return err
	}
	if !o.relayOnly {
		if err := b.consumer.Start(ctx, topics...); err != nil {
			return err
		}
	}
	consumer := b.consumer
	b.closers = append(b.closers, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = consumer.Close(cctx)
	})
	return nil
}

// baselinePublishers publish the baseline side by side, whatever the
// relay's settings, so runs comparing relay settings share one yardstick.
const baselinePublishers = 4

// measureBaseline measures a raw confirmed publish of --tasks messages,
// then (RabbitMQ) purges them, so the relay starts from a broker as empty
// as the baseline did: RabbitMQ's work per publish grows with what its
// quorum queues hold.
func (b *benchSession) measureBaseline(ctx context.Context) error {
	start := time.Now()
	tps, err := benchBaseline(ctx, b.cl.Pub, b.o.topic, b.o.tasks, baselinePublishers)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	b.res.BaselineTPS = tps
	b.res.BaselineStartMS, b.res.BaselineEndMS = start.UnixMilli(), time.Now().UnixMilli()
	fmt.Fprintf(b.env.Stderr, "baseline: %d confirmed publishes at %.0f/s\n", b.o.tasks, tps)
	if b.env.Broker().Broker == "rabbit" && !b.inProcess {
		bs := b.env.Broker()
		cfg, err := driver.ConfigOf[rabbit.Config](&bs, nil)
		if err != nil {
			return err
		}
		if _, err := rabbit.PurgeTopic(ctx, cfg, b.o.topic); err != nil {
			return fmt.Errorf("baseline: purge its messages: %w", err)
		}
	}
	return nil
}

// newRelay builds the relay. Its progress is counted in memory: polling
// the table for it would itself load the database the bench measures.
func (b *benchSession) newRelay() error {
	hooks := b.m.RelayHooks()
	// Published rows are counted as the broker confirms them
	// (confirmClock), so --trickle's do not count.
	dead := hooks.Dead
	hooks.Dead = func(n int) { b.tasks.relayed.Add(int64(n)); dead(n) }
	var err error
	b.relay, err = outbox.NewRelay(b.db, broker.TracePublisher(confirmClock{b.cl.Pub, b.tasks, b.trickle}, b.tracing, "send"), outbox.RelayConfig{Workers: b.o.relayWkrs, BatchSize: b.o.relayBatch,
		Lookahead: b.ahead, Pace: b.o.pace, Logger: b.env.Log, Hooks: hooks})
	return err
}

// schedule writes every task from --producers goroutines, --per-tx a
// transaction, at --rate.
func (b *benchSession) schedule(ctx context.Context) error {
	o := b.o
	var scheduled atomic.Int64
	start := time.Now()
	var perr error
	var perrOnce sync.Once
	var pw sync.WaitGroup
	next := atomic.Int64{}
	for range o.producers {
		pw.Add(1)
		go func() {
			defer pw.Done()
			for {
				first := int(next.Add(int64(o.perTx))) - o.perTx
				if first >= o.tasks || ctx.Err() != nil {
					return
				}
				last := min(first+o.perTx, o.tasks)
				if o.rate > 0 {
					if d := time.Until(start.Add(time.Duration(float64(first) / o.rate * float64(time.Second)))); d > 0 {
						time.Sleep(d)
					}
				}
				anchor := time.Now()
				if o.anchored {
					anchor = start
				}
				relay := b.relay
				if o.noNudge {
					relay = nil
				}
				// With --trace, one request's span per transaction, as the
				// order service's would be.
				tctx, sp := ctx, trace.Span(nil)
				if b.tracing.On() {
					tctx, sp = b.tracing.Tracer.Start(ctx, "place orders")
				}
				err := benchSchedule(tctx, b.db, b.tasks, anchor, first, last, o.delay, o.spread, o.tasks, relay, o.handler == "db")
				if sp != nil {
					sp.End()
				}
				if err != nil {
					perrOnce.Do(func() { perr = err })
					return
				}
				scheduled.Add(int64(last - first))
			}
		}()
	}
	pw.Wait()
	if perr != nil {
		return fmt.Errorf("schedule: %w", perr)
	}
	b.scheduleStart = start
	b.res.Scheduled = scheduled.Load()
	b.res.ScheduleTPS = float64(b.res.Scheduled) / time.Since(start).Seconds()
	return nil
}

// waitForHandlers waits until every task ran or --wait passed the last
// due time.
func (b *benchSession) waitForHandlers(ctx context.Context) {
	var lastDue int64
	for _, d := range b.tasks.due {
		lastDue = max(lastDue, d)
	}
	deadline := time.UnixMilli(lastDue).Add(b.o.wait)
	for b.tasks.count.Load() < int64(b.o.tasks) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
}

// dropSpans is the exporter of --trace: the spans are made, batched and
// handed over as a traced service's are, then dropped, so the bench
// measures what tracing costs this process and not a collector.
type dropSpans struct{}

func (dropSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (dropSpans) Shutdown(context.Context) error                             { return nil }
