package broker

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Backoff shapes the delay before each retry: Initial, multiplied by
// Multiplier per failed attempt up to Max, each randomised by ±Jitter (a
// fraction). The zero value means the defaults in ConsumerConfig.
type Backoff struct {
	Initial    time.Duration
	Max        time.Duration
	Multiplier float64
	Jitter     float64
}

// Hooks are called as messages move through the runtime, for metrics. Any of
// them may be nil. They run on the worker goroutine and must not block.
type Hooks struct {
	// Handled is called after the handler applied a message (returned
	// nil), with its lateness: the time it started minus DeliverAt, never
	// negative. A message the handler skipped (returned a Skip error: its
	// task was cancelled, done or rescheduled) does not count.
	Handled func(topic string, lateness time.Duration)
	// Settled is called once for every delivery the runtime settled, with
	// its outcome: applied (after Handled), skipped with the handler's
	// reason, retried (after Retried) or dead (after Dead). reason is
	// empty but for skipped.
	Settled func(topic string, o Outcome, reason string)
	// Hopped is called after an early message was published again as hop.
	Hopped func(topic string, hop int)
	// Retried is called after a failed message was published again for
	// attempt (1 for the first retry).
	Retried func(topic string, attempt int)
	// Dead is called after a message was handed to the dead letter.
	Dead func(topic string, reason error)
	// Grouped is called after each call of the GroupHandler that
	// committed, once per topic of the group, with how many of that
	// topic's messages it took and how long the whole group ran: how well
	// the group commit amortises its transaction under the load at hand. A
	// group takes the messages due together whatever their topic; one that
	// failed whole (its messages then run one at a time) is not reported.
	Grouped func(topic string, size int, took time.Duration)
	// Stuck is called when a handler is abandoned because it ran
	// HandlerGrace past its HandlerTimeout (see ConsumerConfig.HandlerGrace);
	// for a group, with the topic of its first message.
	Stuck func(topic string)
	// Limited is called after a delivery waited for its topic's Rate or
	// Concurrency, with how long it waited from its due time.
	Limited func(topic string, waited time.Duration)
	// Rerun is called each time a handler runs again for a message whose
	// earlier run of the same attempt was rolled back with its group
	// (Message.Rerun). Its outcome is reported by Settled as usual.
	Rerun func(topic string)
}

// TopicPolicy is how the runtime runs the messages of one topic
// (ConsumerConfig.Topics). A zero field keeps the consumer-wide value.
type TopicPolicy struct {
	// GroupSize bounds how many of the topic's messages one group
	// holds. 1 never puts them in a group: each runs alone, in a
	// transaction of its own, so another message's failure never runs
	// its handler again. Use it for a handler that calls out.
	GroupSize int
	// MaxAttempts is how many times the handler runs before the message
	// goes to dead.
	MaxAttempts int
	// Backoff is the retry delay; each zero field keeps the
	// consumer-wide one.
	Backoff Backoff
	// HandlerTimeout bounds one handler run, and one group of the topic.
	HandlerTimeout time.Duration
	// Rate bounds how many of the topic's deliveries a second this
	// consumer takes to its handler; 0 is no bound. The rest wait in the
	// broker, unacked up to the prefetch, never lost and never early.
	// Each consumer process counts on its own: n processes take up to n
	// times Rate. A delivery that waits reports it to Hooks.Limited.
	Rate float64
	// Concurrency bounds how many of the topic's deliveries this consumer
	// has in progress at once, from due to settled; 0 is no bound. The
	// rest wait in the broker, as for Rate. Each process counts on its
	// own. It is not the workers' count (ConsumerConfig.Concurrency),
	// which all topics share.
	Concurrency int
}

// ConsumerConfig configures a Consumer. Every zero value means the default
// stated on the field; NewConsumer refuses a negative one, and a Backoff
// that shrinks, tops out below its start, or jitters by more than 1.
type ConsumerConfig struct {
	// Concurrency is how many handlers (and, with Group, group
	// transactions) run at once. Default DefaultConcurrencyFor(GOMAXPROCS):
	// 4 on one or two cores, 6 on three, 8 on four or more. A consumer of
	// two topics or more runs one more, a spare worker for the topics
	// with no backlog, so one topic's burst never keeps another waiting
	// for a worker; size the database pool for it.
	Concurrency int
	// HoldWindow is how early a message may arrive and still be waited out in
	// memory (unacked, so it keeps counting against the subscriber's prefetch)
	// rather than published again as another hop. Default 5s, and never less
	// than twice the publisher's precision.
	HoldWindow time.Duration
	// MaxAttempts is how many times the handler runs before the message goes
	// to dead. Default 10.
	MaxAttempts int
	// Backoff is the retry delay. Default 1s initial, ×2, at most 1h, ±50%.
	Backoff Backoff
	// HandlerTimeout bounds one handler run: its context is cancelled then,
	// and an error it returns counts as a failed attempt. Default 1m.
	HandlerTimeout time.Duration
	// HandlerGrace is how long a handler may keep running after its
	// context was cancelled. A handler that ignores its context and
	// outlives HandlerTimeout plus HandlerGrace is abandoned: its goroutine
	// is left to finish on its own (logged, counted by Stuck and the Stuck
	// hook), its worker is freed, and its message counts as a failed
	// attempt with ErrHandlerStuck, so it is retried with backoff and, out
	// of attempts, goes to dead. Nothing is lost and one stuck handler never
	// holds a worker for good; if the abandoned handler later commits, its
	// effect and the retry's are one through outbox.Handle. The same holds
	// for a GroupHandler, whose messages then go one at a time. Default 10s.
	HandlerGrace time.Duration
	// MaxDelay is the furthest due time accepted; a message due later goes
	// to dead with ErrTooFar. Default DefaultMaxDelay.
	MaxDelay time.Duration
	// DeadLetter receives what the runtime gives up on. Default: published
	// to DefaultDeadTopic through the consumer's publisher.
	DeadLetter DeadLetter
	// OnRetry, when set, is told of each retry before it is published
	// (outbox.RecordRetry).
	OnRetry RetryRecorder
	// Group, when set, receives the due messages of one topic a worker
	// finds waiting at once, up to GroupSize of them: one when idle, more
	// under load, with no wait to fill a group. Topics take turns, so a
	// burst on one never queues another's messages behind it. The Handler handles a message that arrives
	// alone and each message of a group that failed as a whole.
	// outbox.NewConsumer sets it.
	Group GroupHandler
	// GroupSize bounds one group. Default DefaultGroupSize.
	GroupSize int
	// Topics sets, by topic, a policy that overrides GroupSize,
	// MaxAttempts, Backoff and HandlerTimeout for that topic's messages.
	Topics map[string]TopicPolicy
	// Hooks are metric callbacks.
	Hooks Hooks
	// Logger receives the runtime's logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time

	// tracing makes a span of each delivery the handler runs (see
	// WithTracing). Off by default.
	tracing Tracing
}

// WithTracing returns cfg with a span made for each delivery the handler
// runs, in the context the handler receives, linked to the span that
// scheduled the task. A zero t turns it off.
func WithTracing(cfg ConsumerConfig, t Tracing) ConsumerConfig {
	cfg.tracing = t
	return cfg
}

// Defaults the runtime applies to a zero ConsumerConfig.
const (
	// DefaultConcurrency is the most handlers a zero Concurrency runs at
	// once; fewer with fewer cores (DefaultConcurrencyFor).
	DefaultConcurrency    = 8
	DefaultHoldWindow     = 5 * time.Second
	DefaultMaxAttempts    = 10
	DefaultHandlerTimeout = time.Minute
	DefaultHandlerGrace   = 10 * time.Second
	// DefaultMaxDelay is the longest delay outbox.Schedule accepts by
	// default (10 years) and a day more: a task scheduled at that limit
	// still passes a consumer whose clock runs behind the producer's.
	DefaultMaxDelay = 10*365*24*time.Hour + 24*time.Hour
	// DefaultGroupSize: up to 200 tasks a transaction. One transaction a
	// task makes the database the limit. Under load, larger groups cost
	// less CPU a task and keep tasks closer to on time. What they trade: a
	// group holds its rows' locks until it commits, longer the larger it
	// is. The figures are in docs/tuning.md, "Why these values".
	DefaultGroupSize = 200
)

// pauseBeforeNack keeps a delivery that could not be settled (its re-publish
// or dead letter failed) from spinning through the broker while it is down.
const pauseBeforeNack = time.Second

// DefaultConcurrencyFor is the default Concurrency with procs cores
// (GOMAXPROCS): two workers a core, from 4 to DefaultConcurrency. Each
// worker holds a database connection and runs its group's statements one
// after another; groups grow with what waits, so a few workers keep up
// with thousands of tasks a second, and on a small box more workers only
// compete with the database and the broker for the same cores
// (docs/tuning.md). A handler that waits on something slow, such as a
// remote call, needs more: set Concurrency.
func DefaultConcurrencyFor(procs int) int {
	return min(DefaultConcurrency, max(4, 2*procs))
}

// Check reports what NewConsumer refuses in c, without a broker: a
// negative count or duration (zero is the default), and a backoff that
// shrinks, jitters by more than the delay itself, or tops out below where
// it starts.
func (c ConsumerConfig) Check() error {
	var bad []string
	neg := func(name string, v int64) {
		if v < 0 {
			bad = append(bad, fmt.Sprintf("%s %d is negative", name, v))
		}
	}
	negD := func(name string, d time.Duration) {
		if d < 0 {
			bad = append(bad, fmt.Sprintf("%s %v is negative", name, d))
		}
	}
	neg("Concurrency", int64(c.Concurrency))
	neg("MaxAttempts", int64(c.MaxAttempts))
	neg("GroupSize", int64(c.GroupSize))
	negD("HoldWindow", c.HoldWindow)
	negD("HandlerTimeout", c.HandlerTimeout)
	negD("HandlerGrace", c.HandlerGrace)
	negD("MaxDelay", c.MaxDelay)
	negD("Backoff.Initial", c.Backoff.Initial)
	negD("Backoff.Max", c.Backoff.Max)
	bad = append(bad, c.Backoff.problems("Backoff")...)
	topics := make([]string, 0, len(c.Topics))
	for t := range c.Topics {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	for _, t := range topics {
		p := c.Topics[t]
		if err := ValidateTopic(t); err != nil {
			bad = append(bad, fmt.Sprintf("Topics: %v", err))
			continue
		}
		neg("Topics["+t+"].GroupSize", int64(p.GroupSize))
		neg("Topics["+t+"].MaxAttempts", int64(p.MaxAttempts))
		negD("Topics["+t+"].HandlerTimeout", p.HandlerTimeout)
		negD("Topics["+t+"].Backoff.Initial", p.Backoff.Initial)
		negD("Topics["+t+"].Backoff.Max", p.Backoff.Max)
		neg("Topics["+t+"].Concurrency", int64(p.Concurrency))
		if p.Rate < 0 || math.IsNaN(p.Rate) || math.IsInf(p.Rate, 0) {
			bad = append(bad, fmt.Sprintf("Topics[%s].Rate %v is not a rate (a second, 0 for none)", t, p.Rate))
		}
		if b := p.Backoff.problems("Topics[" + t + "].Backoff"); len(b) > 0 {
			bad = append(bad, b...)
		} else if m := p.Backoff.or(c.Backoff.or(defaultBackoff)); m.Initial > m.Max {
			// The topic's backoff as it runs: its fields over the consumer's.
			bad = append(bad, fmt.Sprintf("Topics[%s].Backoff starts at %v, above its Max %v", t, m.Initial, m.Max))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("broker: NewConsumer: ConsumerConfig: %s (zero means the default)", strings.Join(bad, "; "))
	}
	return nil
}

func (c ConsumerConfig) withDefaults(pub Publisher) ConsumerConfig {
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrencyFor(runtime.GOMAXPROCS(0))
	}
	if c.HoldWindow <= 0 {
		c.HoldWindow = DefaultHoldWindow
	}
	if p := 2 * pub.Limits().precision(); c.HoldWindow < p {
		c.HoldWindow = p
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	c.Backoff = c.Backoff.or(defaultBackoff)
	if c.HandlerTimeout <= 0 {
		c.HandlerTimeout = DefaultHandlerTimeout
	}
	if c.HandlerGrace <= 0 {
		c.HandlerGrace = DefaultHandlerGrace
	}
	if c.GroupSize <= 0 {
		c.GroupSize = DefaultGroupSize
	}
	if c.MaxDelay <= 0 {
		c.MaxDelay = DefaultMaxDelay
	}
	if c.DeadLetter == nil {
		c.DeadLetter = PublishDead(pub, DefaultDeadTopic)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	// Each topic's policy in full, so the runtime reads one value.
	topics := make(map[string]TopicPolicy, len(c.Topics))
	for t, p := range c.Topics {
		topics[t] = TopicPolicy{
			GroupSize:      cmp.Or(p.GroupSize, c.GroupSize),
			MaxAttempts:    cmp.Or(p.MaxAttempts, c.MaxAttempts),
			Backoff:        p.Backoff.or(c.Backoff),
			HandlerTimeout: cmp.Or(p.HandlerTimeout, c.HandlerTimeout),
			Rate:           p.Rate,
			Concurrency:    p.Concurrency,
		}
	}
	c.Topics = topics
	return c
}

// policy is how the runtime runs topic's messages: its TopicPolicy, or
// the consumer-wide settings. c has its defaults.
func (c *ConsumerConfig) policy(topic string) TopicPolicy {
	if p, ok := c.Topics[topic]; ok {
		return p
	}
	return TopicPolicy{GroupSize: c.GroupSize, MaxAttempts: c.MaxAttempts, Backoff: c.Backoff, HandlerTimeout: c.HandlerTimeout}
}

// defaultBackoff is the retry delay of a zero Backoff.
var defaultBackoff = Backoff{Initial: time.Second, Max: time.Hour, Multiplier: 2, Jitter: 0.5}

// or fills each zero (or, for Multiplier and Jitter, out of range) field
// of b from d.
func (b Backoff) or(d Backoff) Backoff {
	if b.Initial <= 0 {
		b.Initial = d.Initial
	}
	if b.Max <= 0 {
		b.Max = d.Max
	}
	if b.Multiplier < 1 {
		b.Multiplier = d.Multiplier
	}
	if b.Jitter <= 0 || b.Jitter > 1 {
		b.Jitter = d.Jitter
	}
	return b
}

// problems says what is wrong with b, its fields named after name.
func (b Backoff) problems(name string) []string {
	var bad []string
	if b.Multiplier != 0 && b.Multiplier < 1 {
		bad = append(bad, fmt.Sprintf("%s.Multiplier %v would shrink the delay; want at least 1 (0 for the default, 2)", name, b.Multiplier))
	}
	if b.Jitter < 0 || b.Jitter > 1 {
		bad = append(bad, fmt.Sprintf("%s.Jitter %v is a fraction of the delay; want 0 to 1 (0 for the default, 0.5)", name, b.Jitter))
	}
	if b.Max > 0 && b.Initial > b.Max {
		bad = append(bad, fmt.Sprintf("%s.Max %v is below %s.Initial %v", name, b.Max, name, b.Initial))
	}
	return bad
}
