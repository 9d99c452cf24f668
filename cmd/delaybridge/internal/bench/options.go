package bench

import (
	"fmt"
	"math"
	"time"

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// defaultBenchTopic is the topic a bench run uses unless --topic names
// another; keys carry the run id, so a run ignores leftovers of earlier ones.
const defaultBenchTopic = "delaybridge-bench"

// Options are bench's workload and tuning flags.
type Options struct {
	trace      bool
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
	topicRate  float64
	wait       time.Duration
	httpAddr   string
	relayOnly  bool
	dbOnly     bool
	floor      bool
	pace       time.Duration
	topic      string
	noNudge    bool
	// trickle is --trickle's rate; trickleIdle and trickleDelay its
	// other flags.
	trickle      float64
	trickleIdle  time.Duration
	trickleDelay time.Duration
}

// Register adds bench's flags to f. The flags it shares with run take
// their help from cli, so both commands describe them alike.
func (o *Options) Register(f *pflag.FlagSet) {
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
	f.IntVar(&o.relayWkrs, "relay-workers", 0, cli.RelayWorkersHelp)
	f.IntVar(&o.relayBatch, "relay-batch", outbox.DefaultBatchSize, "rows one relay claim takes")
	f.DurationVar(&o.pace, "relay-pace", outbox.DefaultPace, cli.RelayPaceHelp)
	f.DurationVar(&o.lookahead, "lookahead", 0, cli.LookaheadHelp)
	f.BoolVar(&o.anchored, "anchored", false, "count --delay from the start of the bench, not from each task's scheduling")
	f.IntVar(&o.concurrent, "concurrency", 0, "consumer handler concurrency (0 = the library's default)")
	f.StringVar(&o.httpAddr, "http", "", "serve /metrics here while the bench runs (empty = off)")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process to this file, labelled by phase")
	f.StringVar(&o.topic, "topic", defaultBenchTopic, "topic the bench schedules to")
	f.BoolVar(&o.relayOnly, "relay-only", false, "measure scheduling and the relay only: no consumer, no wait (the messages stay in the broker)")
	f.IntVar(&o.group, "group", broker.DefaultGroupSize, "with --handler db, the most due tasks one transaction handles (1 = one at a time)")
	f.Float64Var(&o.topicRate, "topic-rate", 0, "the topic's consumer rate limit, tasks a second (delaybridge.RateLimit; 0 = none)")
	f.DurationVar(&o.wait, "wait", 2*time.Minute, "how long past the last due time to wait for handlers")
	f.BoolVar(&o.noNudge, "no-nudge", false, "producers do not wake the relay after each commit, as when it runs in another process")
	f.BoolVar(&o.dbOnly, "database-only", false, "use an in-process broker instead of --broker, to measure the database and this process alone")
	f.BoolVar(&o.trace, "trace", false, "make OpenTelemetry spans as a traced service would (batched, then dropped)")
	f.Float64Var(&o.trickle, "trickle", 0, "also schedule this many tasks a second to <topic>-trickle, one an order transaction (0 = none)")
	f.DurationVar(&o.trickleIdle, "trickle-idle", 15*time.Second, "with --trickle, how long it runs alone before the main workload starts")
	f.DurationVar(&o.trickleDelay, "trickle-delay", 2*time.Second, "with --trickle, the delay of each of its tasks")
	f.BoolVar(&o.floor, "floor", false, "run the workload with --database-only's broker, then with --broker, and report both")
}

// trickleTopic is the topic of --trickle's tasks.
func (o *Options) trickleTopic() string { return o.topic + "-trickle" }

// maxBenchTasks bounds --tasks: the bench tracks each task (its due time,
// handled time and runs) in memory.
const maxBenchTasks = 10_000_000

// check checks the workload flags and returns the relay's lookahead,
// which lookaheadSetting reads from --lookahead.
func (o *Options) check(fs *pflag.FlagSet, lookaheadSetting func(fs *pflag.FlagSet, v time.Duration) (time.Duration, error)) (time.Duration, error) {
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
	case !(o.topicRate >= 0) || math.IsInf(o.topicRate, 1):
		return 0, fmt.Errorf("--topic-rate %v: need 0 (no limit) or a finite rate", o.topicRate)
	}
	if o.trickle != 0 {
		switch {
		case !(o.trickle > 0) || math.IsInf(o.trickle, 1) || o.trickle > 1000:
			return 0, fmt.Errorf("--trickle %v: need 0 (none) or a rate up to 1000 a second", o.trickle)
		case o.trickleIdle <= 0 || o.trickleDelay < 0:
			return 0, fmt.Errorf("--trickle-idle %v, --trickle-delay %v: need a positive idle time and a delay of 0 or more", o.trickleIdle, o.trickleDelay)
		case o.floor || o.relayOnly || o.preload:
			return 0, fmt.Errorf("--trickle needs the relay running from the start: not with --floor, --relay-only or --preload")
		}
		if err := broker.ValidateTopic(o.trickleTopic()); err != nil {
			return 0, fmt.Errorf("--trickle: %w", err)
		}
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
