package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"golang.org/x/time/rate"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/store"
)

// RelayConfig configures a Relay. Every zero value means the default stated.
type RelayConfig struct {
	// BatchSize is how many rows one claim takes. Default
	// DefaultBatchSize: larger claims relayed faster than 500
	// (BENCHMARKS.md, "Relay throughput").
	BatchSize int
	// Workers is how many claim loops run at once. Their claims take
	// turns, each past the last full batch while they drain a backlog,
	// and their publishes run side by side; SKIP LOCKED keeps their
	// batches apart from other relays'. A relay that is ahead (the oldest
	// row of its last claim due more than half the lookahead away) while
	// consumers have due tasks to handle runs the whole loop one at a
	// time, resting after each full batch as long as it took. Default:
	// the publisher's advice, Limits().RelayWorkers (RocketMQ 8), else
	// DefaultWorkers.
	Workers int
	// Lookahead publishes only rows due within it: a task far from due
	// waits in the database (cheap, and cancelled for free) and moves into
	// the broker shortly before it is due. Default: the publisher's advice,
	// Limits().Lookahead (RabbitMQ ladder 10s, delayed exchange 5s, RocketMQ
	// 60s; see docs/tuning.md).
	// Negative publishes every pending row at once, however far its due
	// time. It must be at least the relay's reaction time (Probe, or
	// IdleMax without a probe) and at most one broker hop (Limits().MaxHop).
	Lookahead time.Duration
	// IdleMin and IdleMax bound the idle poll: after an empty claim the
	// wait doubles from IdleMin up to IdleMax; Nudge cuts it short.
	// Defaults 20ms and 1s.
	IdleMin, IdleMax time.Duration
	// Pace is how long a claim loop waits after a claim that did not fill
	// its batch, while the relay publishes ahead (Lookahead > 0): tasks
	// come into the window at the rate they come due, and a paced relay
	// takes them in batches, a few statements per batch, rather than a few
	// rows per claim. A task due sooner than 2×Pace+Probe (scheduled with
	// a short delay) wakes the loops at once (see Probe), so pacing never
	// makes a task late. Default DefaultPace; negative claims again at once
	// (after IdleMin).
	Pace time.Duration
	// Probe is how often an idle relay checks, with one lock-free read of
	// the index, whether a row came due (scheduled by another process)
	// and wakes its loops if so. Default DefaultProbe; negative turns it
	// off, leaving IdleMax as the latency of an idle relay.
	Probe time.Duration
	// ProbeMax is how seldom the probe looks once the relay is quiet:
	// after ProbeQuietLooks looks in a row with nothing found, no Nudge
	// and no claim that took a row, the probe's wait doubles per look up
	// to ProbeMax; a look that finds a row, or follows a Nudge or such a
	// claim, puts it back at Probe. A
	// wake-up costs a process far more CPU than the read, so how often an
	// idle relay wakes decides most of its CPU (BENCHMARKS.md, "Idle").
	// Default DefaultProbeMax, or Probe when that is
	// longer; set it to Probe to keep one rate. It must be at least Probe.
	ProbeMax time.Duration
	// RetryInitial and RetryMax shape the per-row delay after a transient
	// publish failure, doubling per failure. Defaults 1s and 30s: after a
	// broker outage every row is tried again within 30s of the broker's
	// return, and a row that keeps failing costs one publish per 30s.
	RetryInitial, RetryMax time.Duration
	// PublishTimeout bounds one batch's publish: a broker that is down or
	// blocked (a memory alarm) fails the batch then, and its rows are
	// retried with backoff. The scanner leaves a relay's claimed rows
	// alone until PublishTimeout plus 10 s (the time its outcome may take
	// to record) past the claim, and its grace. Default 10s.
	PublishTimeout time.Duration
	// MaxBatchBytes bounds the payload bytes one claim holds in memory;
	// a claim stops taking rows at it (but always takes one). Default
	// DefaultMaxBatchBytes.
	MaxBatchBytes int64
	// Topics, when not empty, lists the only topics the relay publishes:
	// a row of any other goes dead ("topic refused: …") without reaching
	// the broker, where every topic costs a queue (docs/brokers.md). With
	// Topics set, MaxTopics does not apply.
	Topics []string
	// MaxTopics bounds the distinct topics the relay publishes since it
	// started: a row of a topic past it goes dead ("topic refused: …")
	// without reaching the broker, so a producer writing ever new topics
	// cannot make the broker hold a queue for each. A restart counts
	// afresh; Topics is the firm bound. Default DefaultMaxTopics; negative
	// means no bound.
	MaxTopics int
	// MaxRate bounds how many rows a second the relay claims to publish,
	// across its loops; 0 is no bound. It bounds how fast a backlog
	// drains (after a broker outage, say), so the drain never takes the
	// database from the order service: the rest waits in the table.
	MaxRate float64
	// TopicRates bounds, by topic, how many of its rows a second the relay
	// publishes: a topic's backlog drains at its rate while the others go
	// out as usual. The rest wait in the table. Each relay process counts
	// on its own. Rows of these topics count against MaxRate too.
	TopicRates map[string]float64
	// Hooks are metric callbacks; any may be nil.
	Hooks RelayHooks
	// Logger receives the relay's logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// RelayHooks are called after each claim, for metrics.
type RelayHooks struct {
	// Published reports messages the broker confirmed, and how long
	// their publish took. Their rows were marked published by the claim.
	Published func(n int, took time.Duration)
	// Failed reports rows whose publish failed transiently.
	Failed func(n int)
	// Dead reports rows the broker rejected for good.
	Dead func(n int)
	// Claimed reports each claim transaction and how many rows it took:
	// 0 when it found none. An idle relay looks with one read before it
	// claims, so it claims only when there is something to take.
	Claimed func(n int)
}

func (c RelayConfig) withDefaults() RelayConfig {
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.IdleMin <= 0 {
		c.IdleMin = 20 * time.Millisecond
	}
	if c.IdleMax < c.IdleMin {
		c.IdleMax = max(time.Second, c.IdleMin)
	}
	if c.Probe == 0 {
		c.Probe = DefaultProbe
	}
	if c.ProbeMax == 0 {
		c.ProbeMax = max(c.Probe, DefaultProbeMax)
	}
	if c.Pace == 0 {
		c.Pace = DefaultPace
	}
	if c.RetryInitial <= 0 {
		c.RetryInitial = time.Second
	}
	if c.RetryMax < c.RetryInitial {
		c.RetryMax = max(30*time.Second, c.RetryInitial)
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.MaxTopics == 0 {
		c.MaxTopics = DefaultMaxTopics
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Defaults for RelayConfig.
const (
	DefaultBatchSize      = 1000
	DefaultPublishTimeout = 10 * time.Second
	// DefaultWorkers is RelayConfig.Workers' default when the publisher
	// gives no advice (RabbitMQ, the in-process broker).
	DefaultWorkers = 4
	// DefaultLease is the scanner's lease on the rows a rescue claims.
	DefaultLease = 30 * time.Second
	// DefaultProbe: a task scheduled by another process reaches the
	// broker within about one probe of coming due, for 20 one-row index
	// reads a second.
	DefaultProbe = 50 * time.Millisecond
	// DefaultProbeMax: a task that comes after ProbeQuietLooks looks found
	// nothing reaches the broker within about 80 ms, under the 100 ms an
	// out-of-process relay promises, for 12.5 reads a second. A slower
	// quiet probe costs an idle process less CPU but breaks that promise
	// (BENCHMARKS.md, "Idle").
	DefaultProbeMax = 80 * time.Millisecond
	// ProbeQuietLooks is how many looks in a row that find nothing make a
	// relay quiet, its probe slowing towards ProbeMax: 10 s at the
	// default Probe.
	ProbeQuietLooks = 200
	// DefaultPace: a relay publishing ahead claims about a second of due
	// tasks at a time, up to BatchSize, and a task still reaches the broker
	// a lookahead less a second before it is due. Never more than a fifth
	// of the lookahead.
	DefaultPace = time.Second
	// DefaultMaxBatchBytes is 64 MiB: a batch of 1,000 tasks of 64 KiB
	// each, or 16 of the largest payloads Schedule accepts.
	DefaultMaxBatchBytes = 64 << 20
	// DefaultMaxTopics: a relay publishes at most 64 topics unless told
	// otherwise. On RabbitMQ each is a quorum queue, a few file handles
	// and some memory on every node. A burst of new topics can take all of
	// a node's file handles (docs/brokers.md, "What a topic costs the
	// broker").
	DefaultMaxTopics = 64
)

// Relay moves pending tasks into a broker. It claims a batch of rows in a
// short transaction that leases them and marks them published in one
// write (ClaimLeased with HandOffAt; its claim loops start publishing
// while that transaction's commit is still being flushed), and publishes
// them with a deadline. A confirmed row is then recorded already; a row
// the broker did not confirm goes back to pending, once the claim
// committed and only while the row is still its own. No lock waits on a
// broker that is slow or down, so the business transactions that cancel
// or reschedule tasks never wait on one. A relay that dies after its
// claim leaves published rows with no message behind them; the scanner
// publishes them again once they are overdue, as it does a message a
// broker lost. A row may then be published twice, which Handle makes
// harmless.
type Relay struct {
	db    *sql.DB
	pub   broker.Publisher
	cfg   RelayConfig
	nudge chan bool // true: the probe found a row due within urgent()
	// ahead is set when the last claim's oldest row was due more than
	// leisure() away: every row due sooner is in the broker already. The
	// loops then claim one at a time, holding serial, while consumers
	// have due work (handling).
	ahead  atomic.Bool
	serial chan struct{}
	resume resumePoint
	// busy is set by a Nudge and by a claim that took rows, and cleared by
	// the probe's next look: the relay is not quiet.
	busy   atomic.Bool
	topics topicGate
	// rate bounds the rows claimed a second (MaxRate); nil: no bound.
	rate *rate.Limiter
	// limited are the topics of TopicRates, sorted: the claim loops leave
	// them out, and each has a loop of its own (topicLoop).
	limited []string
	// topicWake has a channel per topic of limited: a Nudge wakes its loop.
	topicWake []chan struct{}
}

// topicGate decides which topics a relay publishes: those of its
// allow-list, or the first max it meets.
type topicGate struct {
	allowed map[string]bool // RelayConfig.Topics; nil: any, up to max
	max     int             // negative: no bound
	mu      sync.Mutex
	seen    map[string]bool // the topics admitted under max
}

// refuse says why a row of topic is not published, "" when it is. A
// topic is admitted for good the first time it is not refused.
func (g *topicGate) refuse(topic string) string {
	switch {
	case g.allowed != nil:
		if g.allowed[topic] {
			return ""
		}
		return fmt.Sprintf("topic refused: %q is not one of the relay's topics (RelayConfig.Topics, delaybridge run --relay-topics)", topic)
	case g.max < 0:
		return ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.seen[topic] {
		return ""
	}
	if len(g.seen) >= g.max {
		return fmt.Sprintf("topic refused: %q is past the %d topics the relay publishes at most (RelayConfig.MaxTopics, delaybridge run --relay-max-topics); every topic costs the broker a queue", topic, g.max)
	}
	if g.seen == nil {
		g.seen = map[string]bool{}
	}
	g.seen[topic] = true
	return ""
}

// resumePoint is where the claim loops of a relay draining a backlog claim
// next. Each full batch leaves its last row's place here, and the next
// claim starts past it instead of at the head of the index, where the rows
// of the batches whose claim is still committing wait, locked (a claim's
// rows leave the pending range once its commit ends): one claim would
// otherwise read each of them again, and a lock and a lookup of the row
// each cost the database more than taking a row. Rows that become
// claimable before the point (a task scheduled due sooner, a failed
// publish due for its retry) are taken by a claim from the head: the first
// claim after a claim came up short, the first after a Nudge or after the
// probe found such a row, and at least one every rescan.
type resumePoint struct {
	mu      sync.Mutex // held across a loop's claim: loops claim one at a time
	at      atomic.Pointer[store.Position]
	scanned time.Time   // when the last claim from the head began
	stale   atomic.Bool // a row may be claimable before at
	// draining holds the topics of the last full batch while the loops
	// drain a backlog of few topics, and othersAt when a claim last looked
	// for the rows of other topics (othersTurn).
	draining []string
	othersAt time.Time
}

// othersEvery is how often, while the loops drain one topic's backlog,
// a claim takes the rows of other topics first: a burst of one topic
// delays another's tasks by about this, not by the whole drain.
const othersEvery = 100 * time.Millisecond

// maxDrainingTopics is the most topics a backlog may have for othersTurn
// to leave them out: past it the backlog is everybody's.
const maxDrainingTopics = 4

// NewRelay returns a relay from db to pub.
func NewRelay(db *sql.DB, pub broker.Publisher, cfg RelayConfig) (*Relay, error) {
	if db == nil || pub == nil {
		return nil, errors.New("outbox: NewRelay needs a database and a publisher")
	}
	cfg, err := cfg.resolve(pub.Limits())
	if err != nil {
		return nil, err
	}
	r := &Relay{db: db, pub: pub, cfg: cfg, nudge: make(chan bool, cfg.Workers), serial: make(chan struct{}, 1)}
	r.topics.max = cfg.MaxTopics
	if cfg.MaxRate > 0 {
		r.rate = tenthLimiter(cfg.MaxRate, cfg.BatchSize)
	}
	for t := range cfg.TopicRates {
		r.limited = append(r.limited, t)
	}
	slices.Sort(r.limited)
	for range r.limited {
		r.topicWake = append(r.topicWake, make(chan struct{}, 1))
	}
	if len(cfg.Topics) > 0 {
		r.topics.allowed = map[string]bool{}
		for _, t := range cfg.Topics {
			r.topics.allowed[t] = true
		}
	}
	return r, nil
}

// Check reports what NewRelay would refuse in c on a publisher with these
// limits, without a database or a broker: a daemon checks its settings
// before it connects. Limits it does not know yet (a RocketMQ broker's,
// read when the publisher connects) may be left zero; NewRelay checks
// them again.
func (c RelayConfig) Check(limits broker.Limits) error {
	_, err := c.resolve(limits)
	return err
}

// resolve applies the defaults, the publisher's advice among them, and
// refuses settings the relay cannot keep.
func (c RelayConfig) resolve(limits broker.Limits) (RelayConfig, error) {
	cfg := c.withDefaults()
	switch {
	case cfg.Lookahead == 0:
		// The advice, within one hop of a short test ladder.
		cfg.Lookahead = limits.Lookahead
		if limits.MaxHop > 0 {
			cfg.Lookahead = min(cfg.Lookahead, limits.MaxHop)
		}
	case cfg.Lookahead < 0:
		cfg.Lookahead = 0 // every pending row at once
	}
	if cfg.Workers <= 0 {
		cfg.Workers = limits.RelayWorkers
		if cfg.Workers <= 0 {
			cfg.Workers = DefaultWorkers
		}
	}
	if cfg.Probe > 0 && cfg.ProbeMax < cfg.Probe {
		return cfg, fmt.Errorf("outbox: NewRelay: ProbeMax %v is shorter than Probe %v; set it to at least Probe (equal keeps the probe at one rate)", cfg.ProbeMax, cfg.Probe)
	}
	if err := checkLookahead(cfg, limits); err != nil {
		return cfg, err
	}
	switch {
	case cfg.Lookahead <= 0 || cfg.Pace < 0:
		cfg.Pace = 0 // claim again after IdleMin, as without a window
	default:
		cfg.Pace = max(min(cfg.Pace, cfg.Lookahead/5), cfg.IdleMin)
	}
	if cfg.MaxRate < 0 || math.IsNaN(cfg.MaxRate) || math.IsInf(cfg.MaxRate, 0) {
		return cfg, fmt.Errorf("outbox: NewRelay: MaxRate %v: want rows a second, or 0 for no bound", cfg.MaxRate)
	}
	for _, t := range cfg.Topics {
		if err := broker.ValidateTopic(t); err != nil {
			return cfg, fmt.Errorf("outbox: NewRelay: Topics: %w", err)
		}
	}
	for t, v := range cfg.TopicRates {
		if err := broker.ValidateTopic(t); err != nil {
			return cfg, fmt.Errorf("outbox: NewRelay: TopicRates: %w", err)
		}
		if !(v > 0) || math.IsInf(v, 0) {
			return cfg, fmt.Errorf("outbox: NewRelay: TopicRates[%s] %v: want rows a second, more than 0", t, v)
		}
	}
	return cfg, nil
}

// checkLookahead refuses a lookahead the relay cannot keep: shorter than
// the relay takes to notice a row came due, every task would reach the
// broker late; longer than one hop, every task published that early would
// need a second one.
func checkLookahead(cfg RelayConfig, limits broker.Limits) error {
	if cfg.Lookahead <= 0 {
		return nil
	}
	react, what := cfg.ProbeMax, "ProbeMax"
	if cfg.Probe <= 0 {
		react, what = cfg.IdleMax, "IdleMax (the probe is off)"
	}
	if cfg.Lookahead < react {
		return fmt.Errorf("outbox: NewRelay: Lookahead %v is shorter than the relay's %s %v, so tasks would reach the broker after they are due; raise Lookahead to at least %v or lower %s",
			cfg.Lookahead, what, react, react, what)
	}
	if limits.MaxHop > 0 && cfg.Lookahead > limits.MaxHop {
		return fmt.Errorf("outbox: NewRelay: Lookahead %v is longer than one broker hop (%v), so every task published that early would hop twice; lower Lookahead to at most %v or raise the broker's limit",
			cfg.Lookahead, limits.MaxHop, limits.MaxHop)
	}
	return nil
}

// batchSize is how many rows one claim takes: BatchSize, or less under
// MaxRate.
func (r *Relay) batchSize() int {
	if r.rate != nil {
		return min(r.cfg.BatchSize, r.rate.Burst())
	}
	return r.cfg.BatchSize
}

// Lookahead returns the lookahead the relay keeps, after the defaults: zero
// when it publishes every pending row at once.
func (r *Relay) Lookahead() time.Duration { return r.cfg.Lookahead }

// Workers returns how many claim loops the relay runs, after the defaults.
func (r *Relay) Workers() int { return r.cfg.Workers }

// Nudge wakes an idle claim loop at once. Producers in the same process call
// it after committing a Schedule to cut the relay's latency to a round trip.
// The next claim starts at the head of the index, where the new task may be.
func (r *Relay) Nudge() {
	r.resume.stale.Store(true)
	r.busy.Store(true)
	r.wake(false)
	for _, w := range r.topicWake {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// wake wakes an idle claim loop; urgent says a row is due within urgent().
func (r *Relay) wake(urgent bool) {
	select {
	case r.nudge <- urgent:
	default:
	}
}

// Run claims and publishes until ctx is done, then waits for its loops to
// finish their current batch (recording what the broker confirmed and
// releasing the rest) and returns nil.
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for i := 0; i < r.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.loop(ctx)
		}()
	}
	if r.cfg.Probe > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.probe(ctx)
		}()
	}
	for i, t := range r.limited {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.topicLoop(ctx, t, r.topicWake[i])
		}()
	}
	wg.Wait()
	return nil
}

// leisure is how far from due the oldest row a claim takes must be for the
// relay to count as ahead: half the lookahead, and never less than the
// probe's urgency, so a row the probe wakes the loops for is never
// claimed one loop at a time.
func (r *Relay) leisure() time.Duration {
	return max(r.urgent(), r.cfg.Lookahead/2)
}

// loop claims until ctx is done. A relay that is ahead claims with one
// loop at a time, and after a full batch rests as long as the batch took:
// the rows it publishes then are not due for seconds, and four loops
// claiming, publishing and marking a pace's worth at once took every core
// of a small box for a moment each pace, delaying the consumers handling
// the tasks due right then. When a claim's oldest row is due within
// leisure(), or the probe woke the loop for a row due soon, the loops claim
// side by side, without rest, again.
func (r *Relay) loop(ctx context.Context) {
	idle := r.cfg.IdleMin
	urgent := false // the probe woke this loop for a row due soon
	errWait := &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.3, Multiplier: 2,
		MaxInterval: 10 * time.Second, Clock: backoff.SystemClock}
	errWait.Reset()
	look := false // look before claiming: the last claim found nothing
	for ctx.Err() == nil {
		var n int
		var err error
		// An idle loop looks before it claims: an empty claim is a
		// transaction of three statements, the look one read. A failed
		// look claims, and the claim reports the error.
		claim := !look
		if look {
			ok, lerr := r.ready(ctx, r.cfg.Lookahead)
			claim = ok || lerr != nil
		}
		if claim {
			n, err = r.claim(ctx, urgent)
		}
		urgent = false
		look = err == nil && n == 0
		var wait time.Duration
		switch {
		case err != nil && ctx.Err() == nil:
			wait = errWait.NextBackOff()
			r.cfg.Logger.Warn("delaybridge relay: claim failed", "err", err, "retry_in", wait)
		case err != nil:
			return
		case n == r.batchSize():
			errWait.Reset()
			idle = r.cfg.IdleMin
			continue
		default:
			errWait.Reset()
			wait = idle
			idle = min(2*idle, r.cfg.IdleMax)
			if n > 0 {
				idle = r.cfg.IdleMin
				if r.cfg.Pace > 0 {
					wait = r.cfg.Pace
				}
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case urgent = <-r.nudge:
			t.Stop()
			idle = r.cfg.IdleMin
			look = false // woken for a row: claim it without looking
		case <-t.C:
		}
	}
}

// claim runs Once. A loop not woken for an urgent row, of a relay that is
// ahead while consumers are handling due tasks (handling), holds serial
// for it and, after a full batch while still ahead, rests as long as the
// batch took before letting the next loop claim: the relay's work spreads
// over the pace instead of coming all at once. With nothing due, the
// relay's work delays nobody's task, and every loop claims at full speed.
func (r *Relay) claim(ctx context.Context, urgent bool) (int, error) {
	if urgent || !r.ahead.Load() || !r.handling(ctx) {
		return r.once(ctx, true)
	}
	select {
	case r.serial <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-r.serial }()
	began := time.Now()
	n, err := r.once(ctx, true)
	if err == nil && n == r.batchSize() && r.ahead.Load() {
		t := time.NewTimer(time.Since(began))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return n, err
}

// Once claims one batch, publishes it and records the outcome, returning
// how many rows it claimed. The claim commits before the publish starts
// (ClaimLeased), the publish has PublishTimeout, and each outcome is
// recorded only on rows the claim still owns: a task cancelled or
// rescheduled meanwhile keeps what its owner did. If ctx ends mid-publish,
// the rows the broker did not confirm go back to pending for the next
// claim.
func (r *Relay) Once(ctx context.Context) (int, error) { return r.once(ctx, false) }

// once is Once; a claim loop's (loop true) may resume where the loops'
// last full batch ended (see resumePoint).
func (r *Relay) once(ctx context.Context, loop bool) (int, error) {
	return r.onceFor(ctx, loop, "", r.batchSize())
}

// onceFor is once for the rows of topic only, up to batchSize of them,
// when topic is set (topicLoop); for every topic but the limited ones
// otherwise.
func (r *Relay) onceFor(ctx context.Context, loop bool, topic string, batchSize int) (int, error) {
	if r.rate != nil {
		// The claim takes no more rows than the bound allows now; the
		// wait comes before the claim, so no lease is held meanwhile.
		if err := r.rate.WaitN(ctx, batchSize); err != nil {
			return 0, fmt.Errorf("outbox relay: %w", cmp.Or(ctx.Err(), err))
		}
	}
	now := r.cfg.Now()
	limit := int64(1<<63 - 1)
	if r.cfg.Lookahead > 0 {
		limit = now.Add(r.cfg.Lookahead).UnixMilli()
	}
	owner := store.NewLeaseOwner()
	// The claim records the hand-off: a confirmed publish writes nothing
	// more, and a relay that dies before its publish leaves published
	// rows the scanner re-publishes once they are overdue. Published, a
	// row is no other relay's to claim; its lease keeps the scanner off
	// it until the publish has timed out and its outcome was recorded.
	spec := store.ClaimSpec{
		State: store.Pending, DueAtMost: limit, ReadyAtMost: now.UnixMilli(), PublishedAtMost: 1<<63 - 1,
		Limit: batchSize, Owner: owner, LeaseUntil: now.Add(r.cfg.PublishTimeout + store.RecordTimeout).UnixMilli(), MaxBytes: r.cfg.MaxBatchBytes,
		Topic: topic, HandOffAt: now.UnixMilli(),
	}
	if topic == "" {
		spec.ExcludeTopics = r.limited
	}
	var batch []store.Claimed
	var err error
	// committed waits for the claim's commit, which a claim loop's claim
	// leaves running while the batch is published: the lease's log flush
	// and the broker's confirm overlap instead of adding up. Every outcome
	// is recorded after it, and nothing when the lease never committed.
	committed := func() error { return nil }
	switch {
	case topic != "":
		batch, committed, err = store.ClaimLeasedEarly(ctx, r.db, spec)
	case loop:
		batch, committed, err = r.claimNext(ctx, spec)
	default:
		batch, err = store.ClaimLeased(ctx, r.db, spec)
	}
	if err == nil && len(batch) == 0 {
		err = committed()
	}
	if err != nil {
		return 0, fmt.Errorf("outbox relay: %w", err)
	}
	if r.cfg.Hooks.Claimed != nil {
		r.cfg.Hooks.Claimed(len(batch))
	}
	if len(batch) == 0 {
		return 0, nil
	}
	r.busy.Store(true)
	if topic == "" {
		// Rows come oldest due first. A limited topic's loop paces
		// itself and says nothing of the other rows.
		r.ahead.Store(r.cfg.Pace > 0 && batch[0].Message.DeliverAt.Sub(now) > r.leisure())
	}

	// A row no broker would carry (written by hand or by another program:
	// a due time of 0, a key too long, a payload no consumer takes) or of
	// a topic the relay does not publish goes dead with the reason at
	// once; it must not be retried forever nor hold up the rows beside it.
	claimed := len(batch)
	batch, invalid := r.splitInvalid(batch)
	if len(invalid) > 0 || len(batch) == 0 {
		// Marked dead under the lease, which must be in first.
		if err := committed(); err != nil {
			return 0, fmt.Errorf("outbox relay: %w", err)
		}
		committed = func() error { return nil }
	}
	var deadErr error
	// Recorded even when ctx ended: left published, these rows would
	// reach the broker through the scanner.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), store.RecordTimeout)
	defer cancel()
	for reason, rows := range invalid {
		if _, err := store.MarkHandOffDead(dctx, r.db, owner, rows, r.cfg.Now().UnixMilli(), reason); err != nil {
			// The valid rows go out all the same. These go back to
			// pending, and the next claim marks them dead; only if that
			// fails too do they stay published for the scanner.
			if _, rerr := store.ReleaseHandOff(dctx, r.db, owner, rows); rerr != nil {
				err = errors.Join(err, rerr)
			}
			deadErr = errors.Join(deadErr, fmt.Errorf("outbox relay: mark invalid rows dead: %w", err))
			continue
		}
		r.cfg.Logger.Error("delaybridge relay: rows the relay does not publish; marked dead", "rows", len(rows), "reason", reason)
		if r.cfg.Hooks.Dead != nil {
			r.cfg.Hooks.Dead(len(rows))
		}
	}
	if len(batch) == 0 {
		return claimed, deadErr
	}
	msgs := make([]*broker.Message, len(batch))
	for i, c := range batch {
		msgs[i] = c.Message
		if c.HeadersErr != nil {
			r.cfg.Logger.Warn("delaybridge relay: unreadable headers dropped", "id", c.Message.TaskID, "err", c.HeadersErr)
		}
	}
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	perr := r.pub.Publish(pctx, msgs...)
	cancel()
	took := time.Since(start)
	if err := committed(); err != nil {
		// The claim may not have committed (or did, and the answer was
		// lost): nothing more of it is recorded. The rows are pending and
		// free, and go out again with a later claim, or published under
		// this claim's lease, and the scanner publishes them again once
		// overdue; a copy the broker already has is a duplicate Handle
		// skips. The next claim starts at the head, not past rows this one
		// may never have leased.
		r.resume.at.Store(nil)
		return claimed, fmt.Errorf("outbox relay: %w", err)
	}
	stopping := ctx.Err() != nil

	results := broker.PublishResults(perr, len(batch))
	// The claim marked every row published: a confirmed row is recorded
	// already. The others go back to pending, or dead, while the claim
	// still owns them; a row a consumer finished (or a payment cancelled)
	// meanwhile stays as they left it.
	ok, failed, dead, rerr := store.Record(ctx, r.db, batch, results, store.RecordParams{
		Owner: owner, From: store.Published, HandedOff: true, Stamp: r.cfg.Now().UnixMilli(), Stopping: stopping,
		RetryInitial: r.cfg.RetryInitial, RetryMax: r.cfg.RetryMax,
		RefusedPrefix: "publish rejected: ", FailedPrefix: "publish failed: ",
	})
	if len(failed) > 0 && !stopping {
		r.cfg.Logger.Warn("delaybridge relay: publish failed; rows stay pending and are retried with backoff", "rows", len(failed), "err", perr)
		if r.cfg.Hooks.Failed != nil {
			r.cfg.Hooks.Failed(len(failed))
		}
	}
	if len(dead) > 0 {
		r.cfg.Logger.Error("delaybridge relay: broker rejected rows for good; marked dead", "rows", len(dead), "err", perr)
		if r.cfg.Hooks.Dead != nil {
			r.cfg.Hooks.Dead(len(dead))
		}
	}
	if len(ok) > 0 && r.cfg.Hooks.Published != nil {
		r.cfg.Hooks.Published(len(ok), took)
	}
	if rerr != nil {
		return claimed, fmt.Errorf("outbox relay: %w", rerr)
	}
	if stopping {
		return claimed, ctx.Err()
	}
	return claimed, deadErr
}

// topicLoop publishes the rows of topic, one of TopicRates, at its rate
// until ctx is done: a tenth of a second's worth a claim, each after the
// limiter let it through. With nothing more to claim it waits for a Nudge
// on wake or IdleMax. The claim loops leave the topic out.
func (r *Relay) topicLoop(ctx context.Context, topic string, wake <-chan struct{}) {
	lim := tenthLimiter(r.cfg.TopicRates[topic], r.cfg.BatchSize)
	for ctx.Err() == nil {
		n := lim.Burst()
		if err := lim.WaitN(ctx, n); err != nil {
			return
		}
		got, err := r.onceFor(ctx, false, topic, n)
		wait := r.cfg.IdleMax
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.cfg.Logger.Warn("delaybridge relay: claim failed", "topic", topic, "err", err, "retry_in", wait)
		case got == n:
			continue // more may be due: the limiter paces the next claim
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// tenthLimiter lets perSecond rows a second through, a tenth of a
// second's worth at a time and never more than a claim's batch: a drain
// stays smooth rather than a full batch and then a long wait.
func tenthLimiter(perSecond float64, batch int) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(perSecond), max(1, min(batch, int(perSecond/10))))
}

// claimNext runs a claim loop's claim, one loop at a time: from the
// resume point while the loops drain a backlog, from the head of the index
// when a row may have become claimable before it, or a rescan is due.
func (r *Relay) claimNext(ctx context.Context, spec store.ClaimSpec) ([]store.Claimed, func() error, error) {
	p := &r.resume
	p.mu.Lock()
	defer p.mu.Unlock()
	began := time.Now()
	if batch, commit, ok, err := r.othersTurn(ctx, spec, began); ok || err != nil {
		return batch, commit, err
	}
	if at := p.at.Load(); at != nil && !p.stale.Load() && began.Sub(p.scanned) < r.rescan() {
		spec.After = at
	} else {
		// Cleared before the claim reads: a row scheduled while it runs
		// marks the point stale again.
		p.stale.Store(false)
		p.scanned = began
	}
	// The next loop may claim while this claim's commit is still under
	// way: the rows stay locked until it ends, so its claim skips them.
	batch, commit, err := store.ClaimLeasedEarly(ctx, r.db, spec)
	if err != nil || len(batch) < spec.Limit {
		// Caught up (or failed): the next claim starts at the head.
		p.at.Store(nil)
		p.draining = nil
		return batch, commit, err
	}
	last := store.PositionOf(batch[len(batch)-1])
	p.at.Store(&last)
	p.draining = drainingTopics(batch)
	return batch, commit, nil
}

// othersTurn, every othersEvery while the loops drain a backlog of at most
// maxDrainingTopics topics, claims from the head of the index the rows of
// every other topic: a task of another topic due meanwhile goes out now,
// not once the backlog is through. It reports ok when it claimed rows; the
// caller then claims no more this turn. It looks first (store.First), so
// with no other topic due it costs one read of the index. r.resume.mu is
// held.
func (r *Relay) othersTurn(ctx context.Context, spec store.ClaimSpec, now time.Time) ([]store.Claimed, func() error, bool, error) {
	p := &r.resume
	if len(p.draining) == 0 || p.at.Load() == nil || now.Sub(p.othersAt) < othersEvery {
		return nil, nil, false, nil
	}
	p.othersAt = now
	spec.ExcludeTopics = append(slices.Clip(spec.ExcludeTopics), p.draining...)
	first, err := store.First(ctx, r.db, spec)
	if err != nil || first == nil {
		return nil, nil, false, err
	}
	batch, commit, err := store.ClaimLeasedEarly(ctx, r.db, spec)
	if err != nil {
		return nil, nil, false, err
	}
	if len(batch) == 0 {
		return nil, nil, false, commit()
	}
	return batch, commit, true, nil
}

// drainingTopics returns the topics of a full batch, nil when it has more
// than maxDrainingTopics or one a claim cannot leave out.
func drainingTopics(batch []store.Claimed) []string {
	var topics []string
	for _, c := range batch {
		t := c.Message.Topic
		if slices.Contains(topics, t) {
			continue
		}
		if len(topics) == maxDrainingTopics || broker.ValidateTopic(t) != nil {
			return nil
		}
		topics = append(topics, t)
	}
	return topics
}

// rescan is how long claims may resume past the head of the index before
// one starts at the head again: a pace, so a row that became claimable
// before the resume point unseen by the probe (due later than urgent())
// still reaches the broker at least a pace before it is due; IdleMax when
// the relay does not pace.
func (r *Relay) rescan() time.Duration {
	if r.cfg.Pace > 0 {
		return r.cfg.Pace
	}
	return r.cfg.IdleMax
}

// splitInvalid takes out of batch the rows the relay must not publish,
// grouped by the reason: a message that fails Validate, a payload larger
// than any consumer accepts, a topic the relay does not publish.
func (r *Relay) splitInvalid(batch []store.Claimed) (valid []store.Claimed, invalid map[string][]store.Claimed) {
	valid = batch[:0:0]
	for _, c := range batch {
		reason := ""
		switch err := c.Message.Validate(); {
		case err != nil:
			reason = "invalid row: " + err.Error()
		case len(c.Message.Payload) > broker.MaxBody:
			// Every consumer refuses it as malformed without marking the
			// row, so published it would be rescued for ever: a foreign
			// producer's row, as Schedule refuses far less.
			reason = fmt.Sprintf("invalid row: payload of %d bytes, more than the %d a consumer accepts", len(c.Message.Payload), broker.MaxBody)
		default:
			reason = r.topics.refuse(c.Message.Topic)
		}
		if reason != "" {
			if invalid == nil {
				invalid = map[string][]store.Claimed{}
			}
			invalid[reason] = append(invalid[reason], c)
			continue
		}
		valid = append(valid, c)
	}
	return valid, invalid
}
