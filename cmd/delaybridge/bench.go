package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/percentile"
	"github.com/delaybridge/delaybridge/outbox"
	"github.com/delaybridge/delaybridge/rabbit"
)

// defaultBenchTopic is the topic a bench run uses unless --topic names
// another; keys carry the run id, so a run ignores leftovers of earlier ones.
const defaultBenchTopic = "delaybridge-bench"

type benchResult struct {
	Broker      string           `json:"broker"`
	Mode        string           `json:"mode"`
	Tasks       int              `json:"tasks"`
	Scheduled   int64            `json:"scheduled"`
	Handled     int64            `json:"handled"`
	Lost        int64            `json:"lost"`
	DupEffects  int64            `json:"dup_effects"`
	Early       int64            `json:"early"`
	ScheduleTPS float64          `json:"schedule_tps"`
	RelayTPS    float64          `json:"relay_tps"`
	BaselineTPS float64          `json:"baseline_publish_tps"`
	Lateness    map[string]int64 `json:"lateness_ms"`
	// PublishLateness is how long after its due time each task reached
	// the broker (the broker's confirm of the relay's publish), 0 for a
	// task published ahead; the relay's share of Lateness.
	PublishLateness map[string]int64 `json:"published_late_ms,omitempty"`
	// PublishAfterCommit is how long after its scheduling transaction
	// committed (or after due, if later) each task reached the broker, 0
	// for one published ahead: the relay's reaction to a task it could
	// first see at that commit, without the producer's own commit.
	PublishAfterCommit map[string]int64 `json:"published_after_commit_ms,omitempty"`
	// DeliveryLateness is how long after its due time each task's message
	// was handed to the consumer runtime: the broker's share of Lateness
	// (and the relay's, for a task that reached the broker late); the
	// rest is the consumer's.
	DeliveryLateness map[string]int64 `json:"delivered_late_ms,omitempty"`
	HandlerMode      string           `json:"handler"`
	Groups           int64            `json:"groups"`
	MeanGroup        float64          `json:"mean_group"`
	MeanGroupMS      float64          `json:"mean_group_ms"`
	ProcessCPU       float64          `json:"process_cpu_s"`
	ElapsedSecond    float64          `json:"elapsed_s"`
	// FirstDueMS and LastHandledMS (unix ms) bound the due window: the
	// work in it could not be done ahead (scripts/bench-cpu.sh measures
	// how busy the box was then).
	FirstDueMS    int64 `json:"first_due_unix_ms"`
	LastHandledMS int64 `json:"last_handled_unix_ms"`
	// The baseline's and the relay's phases (unix ms; the baseline's are 0
	// without --baseline): scripts/bench-relay.sh measures what each
	// process spent in each.
	BaselineStartMS int64 `json:"baseline_start_unix_ms"`
	BaselineEndMS   int64 `json:"baseline_end_unix_ms"`
	RelayStartMS    int64 `json:"relay_start_unix_ms"`
	RelayEndMS      int64 `json:"relay_end_unix_ms"`
	// Floor is the same workload run first through the in-process broker
	// (--floor): what the database and this process alone allowed.
	Floor *benchResult `json:"floor,omitempty"`
	// CommitLatency, with --rate, is how long a one-row autocommit UPDATE
	// took, sampled every commitSample through the run: the database's
	// commit (its log flush) that every claim waits for, so a task's
	// lateness can be no better than its tail.
	CommitLatency map[string]int64 `json:"db_commit_ms,omitempty"`
}

// commitSample is how often a paced run (--rate) times a commit.
const commitSample = 50 * time.Millisecond

// sampleCommits times a one-row autocommit UPDATE of bench_commits every
// commitSample until ctx ends, and returns the durations in ms.
func sampleCommits(ctx context.Context, db *sql.DB) ([]int64, error) {
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS bench_commits (id TINYINT NOT NULL PRIMARY KEY, n BIGINT NOT NULL) ENGINE = InnoDB"); err != nil {
		return nil, fmt.Errorf("bench: commit sampler: %w", err)
	}
	if _, err := db.ExecContext(ctx, "INSERT IGNORE INTO bench_commits VALUES (1, 0)"); err != nil {
		return nil, fmt.Errorf("bench: commit sampler: %w", err)
	}
	var took []int64
	t := time.NewTicker(commitSample)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return took, nil
		case <-t.C:
		}
		start := time.Now()
		if _, err := db.ExecContext(ctx, "UPDATE bench_commits SET n = n + 1 WHERE id = 1"); err != nil {
			if ctx.Err() != nil {
				return took, nil
			}
			return took, fmt.Errorf("bench: commit sampler: %w", err)
		}
		took = append(took, time.Since(start).Microseconds()/1000)
	}
}

// benchRun tracks one run's tasks by index.
type benchRun struct {
	id    string
	topic string
	due   []int64 // unix ms per task
	// committed is when the transaction that scheduled each task had
	// committed (unix ms): from then on another process can see it.
	committed []atomic.Int64
	// published is when the broker first confirmed the relay's publish
	// of each task (unix ms). It is kept here, not read back from the
	// row's published_ms: a consumer that finished the task before the
	// relay marked it leaves the row no publish time.
	published []atomic.Int64
	// delivered is when the consumer runtime was first handed each task's
	// message (unix µs): from due to then is the broker's share of the
	// lateness (the relay's too, for a task published late).
	delivered []atomic.Int64
	handled   []atomic.Int64 // first handled time, unix µs; 0 = not yet
	runs      []atomic.Int32 // handler runs
	count     atomic.Int64
	early     atomic.Int64
	relayed   atomic.Int64 // rows the relay marked published or dead
	// group commits: transactions, the messages in them, their time
	groups, grouped, groupMicros atomic.Int64
}

func (r *benchRun) key(i int) string { return r.id + "-" + strconv.Itoa(i) }

func (r *benchRun) index(key string) (int, bool) {
	rest, ok := strings.CutPrefix(key, r.id+"-")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= len(r.due) {
		return 0, false
	}
	return i, true
}

// seen records a handler run of task i at now.
func (r *benchRun) seen(i int, now time.Time) {
	r.runs[i].Add(1)
	if r.handled[i].CompareAndSwap(0, now.UnixMicro()) {
		r.count.Add(1)
		if now.UnixMilli() < r.due[i] {
			r.early.Add(1)
		}
	}
}

// benchFlags are bench's workload and tuning flags.
type benchFlags struct {
	bf         brokerFlags
	tasks      int
	rate       float64
	delay      time.Duration
	spread     time.Duration
	handler    string
	baseline   bool
	asJSON     bool
	preload    bool
	producers  int
	perTx      int
	relayWkrs  int
	relayBatch int
	lookahead  time.Duration
	anchored   bool
	cpuProfile string
	concurrent int
	group      int
	wait       time.Duration
	httpAddr   string
	relayOnly  bool
	dbOnly     bool
	floor      bool
	pace       time.Duration
	topic      string
	noNudge    bool
}

func (o *benchFlags) register(f *pflag.FlagSet) {
	o.bf.register(f)
	f.IntVar(&o.tasks, "tasks", 10000, "tasks to schedule")
	f.Float64Var(&o.rate, "rate", 0, "tasks scheduled per second (0 = as fast as possible)")
	f.DurationVar(&o.delay, "delay", 2*time.Second, "delay of each task after its scheduling")
	f.DurationVar(&o.spread, "spread", 0, "spread the due times over this window after --delay (0 = one burst)")
	f.StringVar(&o.handler, "handler", "noop", "handler: noop or db (outbox.Handle + conditional UPDATE)")
	f.BoolVar(&o.baseline, "baseline", false, "also measure a raw confirmed publish of the same number of messages")
	f.BoolVar(&o.asJSON, "json", false, "end with one JSON object on the last line of stdout")
	f.BoolVar(&o.preload, "preload", false, "schedule everything before starting the relay")
	f.IntVar(&o.producers, "producers", 8, "concurrent scheduling goroutines")
	f.IntVar(&o.perTx, "per-tx", 1, "tasks scheduled per transaction")
	f.IntVar(&o.relayWkrs, "relay-workers", 0, relayWorkersHelp)
	f.IntVar(&o.relayBatch, "relay-batch", outbox.DefaultBatchSize, "rows one relay claim takes")
	f.DurationVar(&o.pace, "relay-pace", outbox.DefaultPace, relayPaceHelp)
	f.DurationVar(&o.lookahead, "lookahead", 0, lookaheadHelp)
	f.BoolVar(&o.anchored, "anchored", false, "count --delay from the start of the bench, not from each task's scheduling: with --preload and a --delay longer than scheduling and relaying take, every task is in the broker before the first comes due, and the run measures --tasks/--spread due per second")
	f.IntVar(&o.concurrent, "concurrency", 0, "consumer handler concurrency (0 = the library's default: two workers a core (GOMAXPROCS), from 4 to 8; groups grow with what waits, so a few workers suffice)")
	f.StringVar(&o.httpAddr, "http", "", "serve /metrics here while the bench runs (empty = off)")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process to this file (go tool pprof reads it; the baseline and the relay carry the label phase=baseline or phase=relay, for -tagfocus)")
	f.StringVar(&o.topic, "topic", defaultBenchTopic, "topic the bench schedules to: a topic of its own keeps a run clear of what earlier runs left in the broker (a RocketMQ consumer group new to a topic starts from the first message the broker still holds in memory)")
	f.BoolVar(&o.relayOnly, "relay-only", false, "measure scheduling and the relay only: no consumer, no wait (the messages stay in the broker)")
	f.IntVar(&o.group, "group", broker.DefaultGroupSize, "with --handler db, the most due tasks one transaction handles together (outbox.NewConsumer groups what is waiting; 1 handles one at a time)")
	f.DurationVar(&o.wait, "wait", 2*time.Minute, "how long past the last due time to wait for handlers")
	f.BoolVar(&o.noNudge, "no-nudge", false, "the producers do not wake the relay after each commit, as when the relay runs in another process (delaybridge run): it finds each task through its probe, so with --delay 0s the lateness measures how fast an out-of-process relay reacts")
	f.BoolVar(&o.dbOnly, "database-only", false, "use an in-process broker (delivering each message at its due time, 30,000 in flight) instead of --broker, to measure in the same session what the database and this process allow on the workload, with no broker's cost")
	f.BoolVar(&o.floor, "floor", false, "first run the same workload through --database-only's in-process broker, then through --broker, in this one process, and report both: the floor is what the database and this process alone allow on this box at that moment, so the broker run's lateness above it is the broker's share (the summary's floor lines and the JSON key floor; scripts/bench-cpu.sh prints both runs' due windows)")
}

// maxBenchTasks bounds --tasks: the bench tracks each task (its due time,
// handled time and runs) in memory.
const maxBenchTasks = 10_000_000

// check checks the workload flags and returns the relay's lookahead.
func (o *benchFlags) check(fs *pflag.FlagSet) (time.Duration, error) {
	if o.tasks <= 0 || o.producers <= 0 || o.perTx <= 0 || (o.handler != "noop" && o.handler != "db") {
		return 0, fmt.Errorf("need --tasks > 0, --producers > 0, --per-tx > 0 and --handler noop or db")
	}
	if o.tasks > maxBenchTasks {
		return 0, fmt.Errorf("--tasks %d: at most %d (the bench keeps a few bytes a task in memory)", o.tasks, maxBenchTasks)
	}
	if err := broker.ValidateTopic(o.topic); err != nil {
		return 0, fmt.Errorf("--topic: %w", err)
	}
	if o.concurrent < 0 {
		return 0, fmt.Errorf("--concurrency %d: need 0 (the library's default) or more", o.concurrent)
	}
	if o.relayWkrs < 0 {
		return 0, fmt.Errorf("--relay-workers %d: need 0 (the broker's advice) or more", o.relayWkrs)
	}
	switch {
	case !(o.rate >= 0) || math.IsInf(o.rate, 1): // NaN fails the first
		return 0, fmt.Errorf("--rate %v: need 0 (as fast as possible) or a finite rate", o.rate)
	case o.delay < 0 || o.spread < 0 || o.wait < 0:
		return 0, fmt.Errorf("--delay %v, --spread %v, --wait %v: none may be negative", o.delay, o.spread, o.wait)
	case o.relayBatch < 1:
		return 0, fmt.Errorf("--relay-batch %d: need 1 or more", o.relayBatch)
	case o.group < 1:
		return 0, fmt.Errorf("--group %d: need 1 (one task a transaction) or more", o.group)
	}
	if o.floor && (o.dbOnly || o.relayOnly) {
		return 0, fmt.Errorf("--floor compares a broker run with the database alone: not with --database-only or --relay-only")
	}
	ahead, err := lookaheadSetting(fs, o.lookahead)
	if err != nil {
		return 0, err
	}
	if o.relayOnly {
		// The relay's throughput, not its timing: everything at once.
		if ahead > 0 {
			return 0, fmt.Errorf("--relay-only cannot wait for a lookahead: leave --lookahead unset")
		}
		ahead = -1
	}
	return ahead, nil
}

func newBenchCmd(a *app) *cobra.Command {
	o := &benchFlags{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Load-test the whole path: schedule, relay, broker delay, consumer",
		Long: `bench schedules --tasks tasks through outbox.Schedule at --rate per second (0 =
as fast as the producers go), each due --delay after its scheduling (after the
bench start with --anchored) plus its share of --spread (0 = all due in one
burst), runs the relay and a consumer in this process, and waits until every
task was handled or --wait passed the last due time. --handler noop only records the run; --handler db runs outbox.Handle
with a conditional UPDATE of a bench_orders row, the order-timeout shape.
--baseline first measures a confirmed publish of the same number of messages
straight through the adapter, from four goroutines, without the database, in
the same run (its and the relay's start and end go into the JSON); on
RabbitMQ it then purges those messages from the topic's queue, so the relay
starts from a broker as empty as the baseline did.
--preload schedules everything before the relay starts, to measure the relay
alone against a full table. --relay-only leaves its messages in the broker,
where they keep moving until due (RabbitMQ's ladder re-queues them level by
level), which loads the broker for later runs: give such runs a
--rabbit-prefix of their own and delete its queues afterwards.
--floor first runs the same workload through the in-process broker of
--database-only, then through --broker, and reports both: when a target is
out of reach, the floor shows whether the database and this process alone
could reach it on this box at that moment.
With --rate (a paced run, not --relay-only) it also times a one-row
autocommit UPDATE of a bench_commits row every 50 ms through the run and
prints that commit's percentiles (db_commit_ms in the JSON): every claim the
relay makes waits for such a commit, so a task's lateness has its tail.

It prints progress to stderr and a summary; with --json the last line of
stdout is one JSON object. lost = tasks never handled, dup_effects = effects
applied more than once (noop: handler runs beyond the first), early = handled
before due; lateness_ms runs from due to handled, published_late_ms from due
to the broker's confirm (0 for a task published ahead: the relay's share of
the lateness), delivered_late_ms from due to the message reaching the
consumer (the broker's share, and the relay's for a task published late; the
rest is the consumer's), published_after_commit_ms from the later of due and the
commit of the transaction that scheduled the task (the relay's reaction,
without the producer's own commit). It exits non-zero when anything was lost, early, or (db handler)
applied twice.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			// The flags first: a refused run creates no profile file and
			// truncates none.
			ahead, err := o.check(cmd.Flags())
			if err != nil {
				return err
			}
			ln, err := a.listenMetrics(o.httpAddr)
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
			b := &benchSession{a: a, o: o, ahead: ahead, httpLn: ln}
			defer b.close()
			return b.execute(ctx)
		},
	}
	o.register(cmd.Flags())
	return cmd
}

// benchSession is one bench run: its database, broker, consumer, relay and
// the tasks it tracks.
type benchSession struct {
	a     *app
	o     *benchFlags
	ahead time.Duration // the relay's lookahead setting
	// httpLn is where --http serves /metrics, nil when off: listened on
	// before the session touches the database.
	httpLn net.Listener
	// inProcess: cl is the in-process broker (--database-only, or the
	// floor's run); floorRun: this is the floor's run, reported in a line.
	inProcess, floorRun bool

	db       *sql.DB
	cl       *clients
	m        *metrics
	tasks    *benchRun
	res      benchResult
	consumer *broker.Consumer
	relay    *outbox.Relay
	closers  []func()

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
	f := &benchSession{a: b.a, o: b.o, ahead: b.ahead, db: b.db, m: b.m, inProcess: true, floorRun: true}
	f.cl = inProcessClients(b.cl.pub.Limits().Lookahead)
	f.closers = append(f.closers, f.cl.close)
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
	b.res = benchResult{Broker: o.bf.Broker, Mode: o.bf.mode(), Tasks: o.tasks, HandlerMode: o.handler, Floor: floor}
	if b.inProcess {
		b.res.Mode = "database only, " + o.bf.Broker + "'s lookahead"
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
	prog := newProgress(b.a.stderr, o.tasks)
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
	o, a := b.o, b.a
	a.useDevDefaults(&o.bf)
	ses, err := a.openSession(ctx, &o.bf, true, true)
	if err != nil {
		return err
	}
	b.closers = append(b.closers, ses.Close)
	db := ses.db
	b.db = db
	workers := o.concurrent
	if workers == 0 {
		workers = broker.DefaultConcurrencyFor(runtime.GOMAXPROCS(0))
	}
	relayWorkers := o.relayWkrs
	if relayWorkers == 0 {
		relayWorkers = max(ses.cl.pub.Limits().RelayWorkers, outbox.DefaultWorkers)
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
	if _, err := db.ExecContext(ctx, "DELETE FROM delay_task WHERE topic = ?", o.topic); err != nil {
		return err
	}
	if o.dbOnly {
		lookahead := ses.cl.pub.Limits().Lookahead
		ses.cl.close()
		ses.cl = inProcessClients(lookahead)
		b.inProcess = true
	}
	cl := ses.cl
	b.cl = cl
	b.m = newMetrics(db, 30*time.Second, a.log)
	b.closers = append(b.closers, a.serveMetricsOn(b.httpLn, b.m, db, cl.addr))
	return nil
}

// inProcessClients returns the in-process broker --database-only and
// --floor run with, advising lookahead as the broker --broker chose does.
func inProcessClients(lookahead time.Duration) *clients {
	mem := memory.New(memory.Config{Limits: broker.Limits{Lookahead: lookahead}, Prefetch: 30000})
	return &clients{pub: mem, sub: mem, close: func() { _ = mem.Close() },
		ensure: func(context.Context, ...string) error { return nil }}
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
	ccfg := broker.ConsumerConfig{Concurrency: o.concurrent, Logger: b.a.log, Hooks: hooks, GroupSize: o.group}
	// The runtime's hold window with ccfg's HoldWindow unset: a message
	// earlier than that goes on another hop.
	sub := deliveryClock{b.cl.sub, run, max(broker.DefaultHoldWindow, 2*b.cl.pub.Limits().Precision)}
	var err error
	if o.handler == "noop" {
		b.consumer, err = broker.NewConsumer(sub, b.cl.pub, func(ctx context.Context, m *broker.Message) error {
			if i, ok := run.index(m.Key); ok {
				run.seen(i, time.Now())
			}
			return nil
		}, ccfg)
	} else {
		// The order-timeout handler as users write it, one message at a
		// time; outbox.NewConsumer runs the messages due together in
		// shared transactions.
		b.consumer, err = outbox.NewConsumer(b.db, sub, b.cl.pub, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
			i, ok := run.index(m.Key)
			if !ok {
				return nil
			}
			now := time.Now()
			if _, err := tx.ExecContext(ctx, "UPDATE bench_orders SET status = 'CANCELLED', effects = effects + 1 WHERE id = ? AND status = 'UNPAID'", m.Key); err != nil {
				return err
			}
			run.seen(i, now)
			return nil
		}, ccfg)
	}
	if err != nil {
		return err
	}
	if err := b.cl.ensure(ctx, o.topic, broker.DefaultDeadTopic); err != nil {
		return err
	}
	if !o.relayOnly {
		if err := b.consumer.Start(ctx, o.topic); err != nil {
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
	tps, err := benchBaseline(ctx, b.cl.pub, b.o.topic, b.o.tasks, baselinePublishers)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	b.res.BaselineTPS = tps
	b.res.BaselineStartMS, b.res.BaselineEndMS = start.UnixMilli(), time.Now().UnixMilli()
	fmt.Fprintf(b.a.stderr, "baseline: %d confirmed publishes at %.0f/s\n", b.o.tasks, tps)
	if b.o.bf.Broker == "rabbit" && !b.inProcess {
		cfg, err := b.o.bf.rabbitConfig(b.a)
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
	published, dead := hooks.Published, hooks.Dead
	hooks.Published = func(n int, took time.Duration) { b.tasks.relayed.Add(int64(n)); published(n, took) }
	hooks.Dead = func(n int) { b.tasks.relayed.Add(int64(n)); dead(n) }
	var err error
	b.relay, err = outbox.NewRelay(b.db, confirmClock{b.cl.pub, b.tasks}, outbox.RelayConfig{Workers: b.o.relayWkrs, BatchSize: b.o.relayBatch,
		Lookahead: b.ahead, Pace: b.o.pace, Logger: b.a.log, Hooks: hooks})
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
				if err := benchSchedule(ctx, b.db, b.tasks, anchor, first, last, o.delay, o.spread, o.tasks, relay, o.handler == "db"); err != nil {
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

func (b *benchSession) reportRelayOnly() error {
	res, out := b.res, b.a.stdout
	fmt.Fprintf(out, "bench %s (%s), relay only: %d tasks scheduled at %.0f/s, relayed at %.0f/s", res.Broker, res.Mode, res.Scheduled, res.ScheduleTPS, res.RelayTPS)
	if b.o.baseline {
		fmt.Fprintf(out, " (baseline confirmed publish %.0f/s, relay/baseline %.2f)", res.BaselineTPS, res.RelayTPS/res.BaselineTPS)
	}
	fmt.Fprintln(out)
	if b.o.asJSON {
		j, _ := json.Marshal(map[string]any{"broker": res.Broker, "mode": res.Mode, "tasks": b.o.tasks, "scheduled": res.Scheduled,
			"schedule_tps": res.ScheduleTPS, "relay_tps": res.RelayTPS, "baseline_publish_tps": res.BaselineTPS, "process_cpu_s": processCPU(),
			"baseline_start_unix_ms": res.BaselineStartMS, "baseline_end_unix_ms": res.BaselineEndMS,
			"relay_start_unix_ms": res.RelayStartMS, "relay_end_unix_ms": res.RelayEndMS})
		fmt.Fprintln(out, string(j))
	}
	return nil
}

// report counts what was lost, early or applied twice, prints the summary
// and fails the run when an invariant broke.
func (b *benchSession) report() error {
	o, run, res := b.o, b.tasks, &b.res
	res.Handled = run.count.Load()
	res.Lost = int64(o.tasks) - res.Handled
	res.Early = run.early.Load()
	if o.handler == "db" {
		// This run's orders only: a --floor run's are in the table too.
		if err := b.db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM bench_orders WHERE id LIKE ? AND effects > 1", run.id+"-%").Scan(&res.DupEffects); err != nil {
			return err
		}
	} else {
		for i := range run.runs {
			if run.runs[i].Load() > 1 {
				res.DupEffects++
			}
		}
	}
	var late []int64
	for i := range run.handled {
		if res.FirstDueMS == 0 || run.due[i] < res.FirstDueMS {
			res.FirstDueMS = run.due[i]
		}
		if t := run.handled[i].Load(); t != 0 {
			late = append(late, max(t/1000-run.due[i], 0))
			res.LastHandledMS = max(res.LastHandledMS, t/1000)
		}
	}
	l := percentile.Summarize(late)
	res.Lateness = map[string]int64{"p50": l.P50, "p90": l.P90, "p99": l.P99, "max": l.Max}
	res.ElapsedSecond = time.Since(b.scheduleStart).Seconds()
	res.ProcessCPU = processCPU()
	if res.Groups = run.groups.Load(); res.Groups > 0 {
		res.MeanGroup = float64(run.grouped.Load()) / float64(res.Groups)
		res.MeanGroupMS = float64(run.groupMicros.Load()) / 1000 / float64(res.Groups)
	}

	var delivered []int64
	for i := range run.delivered {
		if t := run.delivered[i].Load(); t != 0 {
			delivered = append(delivered, max(t/1000-run.due[i], 0))
		}
	}
	if len(delivered) > 0 {
		d := percentile.Summarize(delivered)
		res.DeliveryLateness = map[string]int64{"p50": d.P50, "p90": d.P90, "p99": d.P99, "max": d.Max}
	}
	if !b.floorRun {
		p, c := run.publishLateness()
		res.PublishLateness = map[string]int64{"p50": p.P50, "p90": p.P90, "p99": p.P99, "max": p.Max, "tasks": int64(p.Count)}
		if c.Count > 0 {
			res.PublishAfterCommit = map[string]int64{"p50": c.P50, "p90": c.P90, "p99": c.P99, "max": c.Max, "tasks": int64(c.Count)}
		}
	}

	out := b.a.stdout
	if b.floorRun {
		fmt.Fprintf(out, "floor (%s), handler %s: handled %d, lost %d, early %d, duplicate effects %d; relayed at %.0f/s\nfloor lateness ms: p50 %d p90 %d p99 %d max %d\n",
			res.Mode, o.handler, res.Handled, res.Lost, res.Early, res.DupEffects, res.RelayTPS, l.P50, l.P90, l.P99, l.Max)
		return res.broken(o.handler)
	}
	fmt.Fprintf(out, "bench %s (%s), handler %s: %d tasks, scheduled %d at %.0f/s, relayed at %.0f/s", res.Broker, res.Mode, o.handler, o.tasks, res.Scheduled, res.ScheduleTPS, res.RelayTPS)
	if o.baseline {
		fmt.Fprintf(out, " (baseline confirmed publish %.0f/s, relay/baseline %.2f)", res.BaselineTPS, res.RelayTPS/res.BaselineTPS)
	}
	fmt.Fprintf(out, "\nhandled %d, lost %d, early %d, duplicate effects %d\nlateness ms: p50 %d p90 %d p99 %d max %d\n",
		res.Handled, res.Lost, res.Early, res.DupEffects, l.P50, l.P90, l.P99, l.Max)
	if p := res.PublishLateness; p != nil {
		fmt.Fprintf(out, "reached the broker after due, ms: p50 %d p90 %d p99 %d max %d\n", p["p50"], p["p90"], p["p99"], p["max"])
	}
	if d := res.DeliveryLateness; d != nil {
		fmt.Fprintf(out, "delivered to the consumer after due, ms: p50 %d p90 %d p99 %d max %d\n", d["p50"], d["p90"], d["p99"], d["max"])
	}
	if c := res.PublishAfterCommit; c != nil {
		fmt.Fprintf(out, "reached the broker after its scheduling commit (or due, if later; %d tasks), ms: p50 %d p90 %d p99 %d max %d\n", c["tasks"], c["p50"], c["p90"], c["p99"], c["max"])
	}
	if res.Groups > 0 {
		fmt.Fprintf(out, "group commit: %d transactions of %.1f messages on average, %.1f ms each\n", res.Groups, res.MeanGroup, res.MeanGroupMS)
	}
	if c := res.CommitLatency; c != nil {
		fmt.Fprintf(out, "database commit (one-row UPDATE every %v through the run, %d samples), ms: p50 %d p90 %d p99 %d max %d\n",
			commitSample, c["samples"], c["p50"], c["p90"], c["p99"], c["max"])
	}
	if f := res.Floor; f != nil {
		fmt.Fprintf(out, "floor, the same workload through the database alone just before: lateness ms p50 %d p90 %d p99 %d max %d\n",
			f.Lateness["p50"], f.Lateness["p90"], f.Lateness["p99"], f.Lateness["max"])
	}
	if o.asJSON {
		j, _ := json.Marshal(res)
		fmt.Fprintln(out, string(j))
	}
	return res.broken(o.handler)
}

// broken fails a run that lost a task, ran one early or, with the
// database handler, applied one's effect twice. The noop handler runs
// without the outbox, so a redelivery runs it again: its duplicates are
// reported, not a failure.
func (res *benchResult) broken(handler string) error {
	if res.Lost > 0 || res.Early > 0 || (handler == "db" && res.DupEffects > 0) {
		return fmt.Errorf("bench: lost %d, early %d, duplicate effects %d", res.Lost, res.Early, res.DupEffects)
	}
	return nil
}

// confirmClock is the relay's publisher in a bench run: it notes when
// the broker confirmed each task's first publish.
type confirmClock struct {
	broker.Publisher
	run *benchRun
}

func (c confirmClock) Publish(ctx context.Context, msgs ...*broker.Message) error {
	err := c.Publisher.Publish(ctx, msgs...)
	now := time.Now().UnixMilli()
	// A batch that failed in part still had the rest confirmed.
	for j, perr := range broker.PublishResults(err, len(msgs)) {
		if perr != nil {
			continue
		}
		if i, ok := c.run.index(msgs[j].Key); ok {
			c.run.published[i].CompareAndSwap(0, now)
		}
	}
	return err
}

// deliveryClock is the consumer's subscriber in a bench run: it notes when
// each task's message was first handed on to the runtime. It passes each
// delivery on as it takes it, so it holds none back.
type deliveryClock struct {
	broker.Subscriber
	run  *benchRun
	hold time.Duration // the consumer's hold window
}

func (c deliveryClock) Subscribe(ctx context.Context, topic string) (<-chan *broker.Delivery, error) {
	in, err := c.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *broker.Delivery)
	go func() {
		defer close(out)
		for d := range in {
			// A message too early to hold is sent on another hop: it has
			// not reached the consumer for good yet.
			if m := d.Message; m != nil && time.Until(m.DeliverAt) <= c.hold {
				if i, ok := c.run.index(m.Key); ok {
					c.run.delivered[i].CompareAndSwap(0, time.Now().UnixMicro())
				}
			}
			select {
			case out <- d:
			case <-ctx.Done():
				// Nobody reads out any more (a Start that failed after
				// subscribing): give this one back, and the rest as they
				// come until the subscription closes.
				for ; d != nil; d = <-in {
					_ = d.Acker.Nack()
				}
				return
			}
		}
	}()
	return out, nil
}

// publishLateness summarizes, over the run's tasks the relay published,
// how long after its due time each reached the broker (0 when it went
// ahead), and how long after the later of due and its scheduling commit.
func (r *benchRun) publishLateness() (fromDue, fromCommit percentile.Summary) {
	var late, afterCommit []int64
	for i := range r.published {
		published := r.published[i].Load()
		if published == 0 {
			continue
		}
		late = append(late, max(published-r.due[i], 0))
		// A task confirmed a moment before the producer heard its
		// commit's answer counts as 0.
		if c := r.committed[i].Load(); c > 0 {
			afterCommit = append(afterCommit, max(published-max(c, r.due[i]), 0))
		}
	}
	return percentile.Summarize(late), percentile.Summarize(afterCommit)
}

// processCPU returns the CPU seconds (user and system) this process used.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// benchSchedule schedules tasks [first, last) in one transaction, task i
// due at anchor + delay + its share i/n of spread, and nudges relay (if
// not nil) once it committed.
func benchSchedule(ctx context.Context, db *sql.DB, run *benchRun, anchor time.Time, first, last int, delay, spread time.Duration, n int, relay *outbox.Relay, orders bool) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	// The transaction's orders and tasks go in multi-row INSERTs
	// (outbox.ScheduleMany), as a service creating many orders at once
	// would write them.
	tasks := make([]outbox.Task, 0, last-first)
	ids := make([]any, 0, last-first)
	for i := first; i < last; i++ {
		due := anchor.Add(delay)
		if spread > 0 {
			due = due.Add(time.Duration(float64(spread) * float64(i) / float64(n)))
		}
		run.due[i] = due.UnixMilli()
		ids = append(ids, run.key(i))
		tasks = append(tasks, outbox.Task{Topic: run.topic, Key: run.key(i), DueAt: due})
	}
	if orders {
		for len(ids) > 0 {
			k := min(len(ids), 500)
			if _, err := tx.ExecContext(ctx, "INSERT INTO bench_orders (id, status) VALUES "+strings.TrimSuffix(strings.Repeat("(?, 'UNPAID'),", k), ","), ids[:k]...); err != nil {
				return err
			}
			ids = ids[k:]
		}
	}
	if len(tasks) == 1 {
		if _, err := outbox.Schedule(ctx, tx, tasks[0]); err != nil {
			return err
		}
	} else if err := outbox.ScheduleMany(ctx, tx, tasks); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	committed := time.Now().UnixMilli()
	for i := first; i < last; i++ {
		run.committed[i].Store(committed)
	}
	if relay != nil {
		relay.Nudge()
	}
	return nil
}

// benchBaseline publishes n messages due at once straight through pub, in
// batches of 500 from workers goroutines, and returns the confirmed rate.
// Their keys belong to no run, so the consumer acks them unhandled.
func benchBaseline(ctx context.Context, pub broker.Publisher, topic string, n, workers int) (float64, error) {
	start := time.Now()
	next := atomic.Int64{}
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				first := int(next.Add(500)) - 500
				if first >= n {
					return
				}
				msgs := make([]*broker.Message, 0, 500)
				for i := first; i < min(first+500, n); i++ {
					msgs = append(msgs, &broker.Message{Topic: topic, Key: "baseline-" + strconv.Itoa(i), DeliverAt: broker.MillisUTC(time.Now())})
				}
				if err := pub.Publish(ctx, msgs...); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds(), firstErr
}

// progress draws a one-line progress bar on stderr.
type progress struct {
	w     io.Writer
	total int
}

func newProgress(w io.Writer, total int) *progress { return &progress{w: w, total: total} }

func (p *progress) line(published int, handled int64) {
	const width = 30
	fill := int(float64(width) * float64(handled) / float64(p.total))
	fmt.Fprintf(p.w, "\r[%s%s] published %d/%d handled %d/%d ", strings.Repeat("#", fill), strings.Repeat(".", width-fill), published, p.total, handled, p.total)
}

func (p *progress) loop(ctx context.Context, run *benchRun) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.line(int(run.relayed.Load()), run.count.Load())
	}
}

func (p *progress) done(run *benchRun) {
	fmt.Fprintf(p.w, "\rhandled %d/%d%s\n", run.count.Load(), p.total, strings.Repeat(" ", 60))
}
