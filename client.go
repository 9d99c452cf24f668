package delaybridge

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/driver"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/services"
)

// ErrStarted is returned by Handle after Start or Stop, and by a second
// Start or one after Stop.
var ErrStarted = errors.New("delaybridge: client already started or stopped")

// Client is delaybridge for an application: it schedules, cancels and
// reschedules tasks in the caller's transaction, runs a handler per topic
// for the tasks that come due (the handler's writes and "task done" commit
// together, tasks due together share a transaction), and stops with a
// graceful drain. It wires the broker the way delaybridge run does, from
// the same Config. Build it with NewClient, register handlers with Handle,
// then Start; Stop when done.
//
// The client is the one way in: the relay, the consumer, the scanner and
// the cleaner it starts are internal, and delaybridge run starts the same
// ones from the same place.
type Client struct {
	db     *sql.DB
	cfg    Config
	broker broker.Adapter

	mu       sync.Mutex
	handlers map[string]outbox.HandlerFunc
	policies map[string]broker.TopicPolicy
	started  bool
	stopped  bool
	conn     *broker.Connection
	consumer *broker.Consumer
	presence *outbox.Announcement
	bg       *services.Group
}

// NewClient returns a client on the outbox database db (migrated with
// Migrate or delaybridge migrate) and the broker cfg names. Zero
// fields of cfg take DefaultConfig's values; cfg.MySQLDSN is not used, as
// db is given. It checks cfg but does not connect: Schedule, Cancel and
// friends work without Start.
func NewClient(db *sql.DB, cfg Config) (*Client, error) {
	if db == nil {
		return nil, errors.New("delaybridge: NewClient needs a database")
	}
	cfg = cfg.withDefaults()
	ad, _, err := cfg.check()
	if err != nil {
		return nil, err
	}
	// The relay's and the scanner's own rules, before Start opens anything
	// (the broker's limits, read when it connects, are checked again then).
	if cfg.Relay != nil {
		if err := cfg.Relay.outbox().Check(broker.Limits{}); err != nil {
			return nil, fmt.Errorf("delaybridge: Config.Relay: %w", err)
		}
	}
	if err := cfg.Consumer.Check(); err != nil {
		return nil, fmt.Errorf("delaybridge: Config.Consumer: %w", err)
	}
	if cfg.Scanner != nil {
		if err := cfg.Scanner.Check(broker.Limits{}); err != nil {
			return nil, fmt.Errorf("delaybridge: Config.Scanner: %w", err)
		}
	}
	return &Client{db: db, cfg: cfg, broker: ad, handlers: map[string]outbox.HandlerFunc{}, policies: map[string]broker.TopicPolicy{}}, nil
}

// Broker is the client's broker adapter: Config.Broker, or the one the
// flat settings name.
func (c *Client) Broker() broker.Adapter { return c.broker }

// Schedule writes t in tx, the caller's transaction: the task exists
// exactly when the caller's own writes commit. A second task of the same
// topic and key is ErrDuplicate; bad input is an error and writes nothing.
func (c *Client) Schedule(ctx context.Context, tx *sql.Tx, t Task) (int64, error) {
	return outbox.Schedule(ctx, tx, t)
}

// Cancel cancels the task of (topic, key) in tx. Cancelling twice is not
// an error; a task already done is ErrFinished. Lock the task
// before the business row it guards, as the handler does.
func (c *Client) Cancel(ctx context.Context, tx *sql.Tx, topic, key string) error {
	return outbox.Cancel(ctx, tx, topic, key)
}

// Reschedule moves the task of (topic, key) to due in tx; a message already
// on its way for the old due time is skipped when it arrives.
func (c *Client) Reschedule(ctx context.Context, tx *sql.Tx, topic, key string, due time.Time) error {
	return outbox.Reschedule(ctx, tx, topic, key, due)
}

// Get reads the task of (topic, key); ErrNotFound when there is
// none. q is the database or a transaction.
func (c *Client) Get(ctx context.Context, q Querier, topic, key string) (*TaskInfo, error) {
	return outbox.Get(ctx, q, topic, key)
}

// Overdue reports whether the task of (topic, key) is due and not yet
// finished, by the database's clock: the read path's lazy check, true as
// soon as the due time passes, before the handler has run.
func (c *Client) Overdue(ctx context.Context, q Querier, topic, key string) (bool, error) {
	return outbox.Overdue(ctx, q, topic, key)
}

// RunNow runs topic's handler (the one Handle registered) for the task of
// (topic, key) in tx, the caller's transaction, and marks the task done
// there, when the task is due by the database's clock and pending or
// published (a dead task waits for its replay).
// It reports whether the handler ran. The read path's lazy check uses it:
// a request that finds an order overdue cancels it at once, in its own
// transaction. Exactly one of RunNow and the broker's delivery runs the
// handler; the other finds the task done. When the handler fails, RunNow
// returns its error: roll tx back, and the delivery runs the task later.
// Call it before other reads in tx, or read business rows in the handler
// with locking reads: a plain read sees tx's first snapshot.
func (c *Client) RunNow(ctx context.Context, tx *sql.Tx, topic, key string) (bool, error) {
	c.mu.Lock()
	fn := c.handlers[topic]
	c.mu.Unlock()
	if fn == nil {
		return false, fmt.Errorf("delaybridge: RunNow %s: no handler registered for the topic", topic)
	}
	return outbox.RunNow(ctx, tx, topic, key, fn)
}

// Handle registers fn for the tasks of topic. fn runs in the database
// transaction that marks the task done: return an error to roll both back
// and retry later. It runs no earlier than the due time and is skipped for
// a cancelled or rescheduled task. Register every topic before Start.
//
// Tasks due together share a transaction. When fn fails for one of them,
// fn runs again for the others ahead of it in that transaction, with
// m.Rerun set: their database writes were rolled back, what fn did
// outside tx was not. A handler that calls out runs alone: pass
// GroupSize(1). opts also set the topic's attempts, backoff and timeout;
// each one not given keeps Config.Consumer's.
func (c *Client) Handle(topic string, fn HandlerFunc, opts ...HandleOption) error {
	if err := broker.ValidateTopic(topic); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("delaybridge: Handle %s: nil handler", topic)
	}
	var p broker.TopicPolicy
	for _, o := range opts {
		if o.set == nil {
			return fmt.Errorf("delaybridge: Handle %s: a zero HandleOption", topic)
		}
		if err := o.set(&p); err != nil {
			return fmt.Errorf("delaybridge: Handle %s: %w", topic, err)
		}
	}
	if err := (broker.ConsumerConfig{Backoff: c.cfg.Consumer.Backoff, Topics: map[string]broker.TopicPolicy{topic: p}}).Check(); err != nil {
		return fmt.Errorf("delaybridge: Handle %s: %w", topic, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started || c.stopped {
		return ErrStarted
	}
	if _, dup := c.handlers[topic]; dup {
		return fmt.Errorf("delaybridge: Handle %s: topic already has a handler", topic)
	}
	c.handlers[topic] = fn
	if p != (broker.TopicPolicy{}) {
		c.policies[topic] = p
	}
	return nil
}

// HandleOption sets how the consumer runs one topic's tasks (Handle).
type HandleOption struct {
	set func(*broker.TopicPolicy) error
}

// GroupSize bounds how many of the topic's tasks share one transaction.
// GroupSize(1) runs each task alone, in a transaction of its own: another
// task's failure never runs its handler again.
func GroupSize(n int) HandleOption {
	return HandleOption{func(p *broker.TopicPolicy) error {
		if n < 1 {
			return fmt.Errorf("GroupSize(%d): want 1 or more", n)
		}
		p.GroupSize = n
		return nil
	}}
}

// MaxAttempts is how many times the handler runs for a task before the
// task goes dead.
func MaxAttempts(n int) HandleOption {
	return HandleOption{func(p *broker.TopicPolicy) error {
		if n < 1 {
			return fmt.Errorf("MaxAttempts(%d): want 1 or more", n)
		}
		p.MaxAttempts = n
		return nil
	}}
}

// RetryBackoff is the delay before each retry of the topic's tasks; its
// zero fields keep Config.Consumer.Backoff's.
func RetryBackoff(b broker.Backoff) HandleOption {
	return HandleOption{func(p *broker.TopicPolicy) error { p.Backoff = b; return nil }}
}

// RateLimit bounds how many of the topic's tasks a second each consumer
// process hands to the handler; the rest wait in the broker, never lost,
// never early. n consumer processes take up to n times perSecond. The
// time tasks wait for it is delaybridge_consumer_limited_seconds_total.
func RateLimit(perSecond float64) HandleOption {
	return HandleOption{func(p *broker.TopicPolicy) error {
		if !(perSecond > 0) || math.IsInf(perSecond, 0) {
			return fmt.Errorf("RateLimit(%v): want a number of tasks a second above zero", perSecond)
		}
		p.Rate = perSecond
		return nil
	}}
}

// MaxConcurrency bounds how many of the topic's tasks each consumer
// process has in progress at once, from due to settled; the rest wait in
// the broker. Use it for a handler that calls a service which takes only
// so many calls at once. It is not Config.Consumer.Concurrency, the
// workers all topics share.
func MaxConcurrency(n int) HandleOption {
	return HandleOption{func(p *broker.TopicPolicy) error {
		if n < 1 {
			return fmt.Errorf("MaxConcurrency(%d): want 1 or more", n)
		}
		p.Concurrency = n
		return nil
	}}
}

// HandlerTimeout bounds one run of the handler: its context is cancelled
// then, and the run counts as a failed attempt.
func HandlerTimeout(d time.Duration) HandleOption {
	return HandleOption{func(p *broker.TopicPolicy) error {
		if d <= 0 {
			return fmt.Errorf("HandlerTimeout(%v): want more than zero", d)
		}
		p.HandlerTimeout = d
		return nil
	}}
}

// Start connects to the broker and starts consuming the registered
// topics, and the relay and scanner when the Config asks for them. Beside
// a relay it runs what delaybridge run runs beside one: the cleaner
// (unless NoCleaner), the counts refresher (unless NoStats) and a relay
// presence record, so status sees a live relay. On RocketMQ with
// rocket.Config.CreateTopics it first creates the topics, their retry
// topics and the dead-letter topic. A Client without handlers,
// relay or scanner has nothing to start and returns nil. When Start fails
// it leaves nothing running.
//
// Before it touches the broker it checks the database: one that lacks a
// migration this binary ships gives an error matching
// ErrSchemaBehind, and a live relay or consumer of another prefix,
// group or ladder gives ErrTopologyMismatch. Either way nothing is
// declared on the broker.
//
// A broker that does not answer is tried again, five times in all over
// about 15 s, while ctx lasts; each failure is logged. Once
// connected, the adapters reconnect on their own. A service that must
// come up whatever the broker does calls Start again in a loop with a
// backoff of its own. ctx bounds the start only: what Start starts runs
// until Stop, whatever becomes of ctx. Start logs one line when it is
// running.
func (c *Client) Start(ctx context.Context) (err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started || c.stopped {
		return ErrStarted
	}
	topics := make([]string, 0, len(c.handlers))
	for t := range c.handlers {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	if len(topics) == 0 && c.cfg.Relay == nil && c.cfg.Scanner == nil {
		c.started = true
		return nil
	}
	// A binary rolled out before its migrations ran refuses here, naming
	// them, rather than failing on a missing column mid-work.
	if err := outbox.CheckSchema(ctx, c.db); err != nil {
		return fmt.Errorf("delaybridge: %w", err)
	}
	// Settings the broker cannot change: refused at once, not retried.
	topo, err := c.broker.Topology()
	if err != nil {
		return err
	}
	// Every failure below returns through err: what was started is
	// stopped again, the presence record withdrawn.
	var conn *broker.Connection
	defer func() {
		if err != nil {
			c.undoStart()
			if conn != nil {
				conn.Close()
			}
		}
	}()
	if len(topics) > 0 {
		// Record this consumer and its topology, and refuse to start when a
		// live relay or consumer uses another prefix, group or ladder:
		// before the broker is opened, which declares the ladder.
		pc := c.cfg.Presence
		pc.Logger = cmp.Or(pc.Logger, c.cfg.Logger)
		if c.presence, err = outbox.Announce(ctx, c.db, outbox.Presence{Role: outbox.RoleConsumer, Topology: topo, Topics: topics}, pc); err != nil {
			return err
		}
	}
	if conn, err = c.openBroker(ctx, len(topics) > 0); err != nil {
		return err
	}
	if len(topics) > 0 {
		if conn.AutoCreate {
			if err = conn.CreateTopics(ctx, append(topics, broker.DefaultDeadTopic)...); err != nil {
				return fmt.Errorf("delaybridge: create topics: %w", err)
			}
		}
		handlers := c.handlers
		cc := c.cfg.Consumer
		cc.Logger = cmp.Or(cc.Logger, c.cfg.Logger)
		if len(c.policies) > 0 {
			cc.Topics = maps.Clone(cc.Topics)
			if cc.Topics == nil {
				cc.Topics = map[string]broker.TopicPolicy{}
			}
			maps.Copy(cc.Topics, c.policies)
		}
		if m := c.cfg.Metrics; m != nil {
			cc.Hooks = joinConsumerHooks(cc.Hooks, m.ConsumerHooks())
		}
		cc = broker.WithTracing(cc, broker.NewTracing(c.cfg.TracerProvider, c.broker.Name()))
		if c.consumer, err = outbox.NewConsumer(c.db, conn.Subscriber, conn.Publisher, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
			fn, ok := handlers[m.Topic]
			if !ok {
				return fmt.Errorf("delaybridge: no handler for topic %s", m.Topic)
			}
			return fn(ctx, tx, m)
		}, cc); err != nil {
			return err
		}
		if err = c.consumer.Start(ctx, topics...); err != nil {
			return err
		}
	}
	if err = c.startBackground(ctx, conn, topo); err != nil {
		return err
	}
	c.conn, c.started = conn, true
	if c.cfg.Relay != nil && c.cfg.Scanner == nil {
		c.cfg.Logger.Warn("delaybridge: this client relays without a scanner; run one elsewhere (delaybridge run), or the tasks of a relay killed mid-batch wait for it")
	}
	c.cfg.Logger.Info("delaybridge: client started", "broker", c.broker.Name(), "mode", c.broker.Mode(), "topology", topo.String(),
		"topics", topics, "relay", c.cfg.Relay != nil, "scanner", c.cfg.Scanner != nil,
		"cleaner", c.cfg.Relay != nil && !c.cfg.NoCleaner, "stats", c.cfg.Relay != nil && !c.cfg.NoStats)
	return nil
}

// startTries and startWait bound how Start waits for a broker that does
// not answer: tries in all, the first wait, doubling (1+2+4+8 s).
const (
	startTries = 5
	startWait  = time.Second
)

// openBroker opens the broker, trying again with a backoff while it does
// not answer, up to startTries times and while ctx lasts.
func (c *Client) openBroker(ctx context.Context, withSub bool) (*broker.Connection, error) {
	wait := startWait
	for try := 1; ; try++ {
		conn, err := driver.Open(ctx, c.broker, c.cfg.SigningKeys, c.cfg.Logger, withSub)
		if err == nil {
			return conn, nil
		}
		if try == startTries || ctx.Err() != nil {
			return nil, err
		}
		c.cfg.Logger.Warn("delaybridge: the broker did not answer; trying again", "broker", c.broker.Name(), "try", try, "of", startTries, "in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		wait *= 2
	}
}

// startBackground starts the relay and the scanner the Config asks for,
// and beside the relay the cleaner, the counts refresher and the relay's
// presence record, as delaybridge run does (internal/services).
func (c *Client) startBackground(ctx context.Context, conn *broker.Connection, topo broker.Topology) error {
	parts := services.Config{Logger: c.cfg.Logger, Tracing: broker.NewTracing(c.cfg.TracerProvider, c.broker.Name())}
	var grace time.Duration
	if c.cfg.Scanner != nil {
		sc := *c.cfg.Scanner
		sc.Logger = cmp.Or(sc.Logger, c.cfg.Logger)
		if m := c.cfg.Metrics; m != nil {
			sc.Hooks = joinScannerHooks(sc.Hooks, m.ScannerHooks())
		}
		parts.Scanner = &sc
		grace = sc.Grace
	}
	if c.cfg.Relay != nil {
		rc := c.cfg.Relay.outbox()
		rc.Logger = cmp.Or(rc.Logger, c.cfg.Logger)
		if m := c.cfg.Metrics; m != nil {
			rc.Hooks = joinRelayHooks(rc.Hooks, m.RelayHooks())
		}
		rc.Hooks = outbox.LogProgress(rc.Hooks, rc.Logger, 0)
		parts.Relay = &rc
		// A process that relays cleans and counts, unless told not to:
		// finished tasks would otherwise pile up with nothing said.
		if !c.cfg.NoCleaner {
			cc := c.cfg.Cleaner
			cc.Logger = cmp.Or(cc.Logger, c.cfg.Logger)
			parts.Cleaner = &cc
		}
		if !c.cfg.NoStats {
			st := c.cfg.Stats
			st.Logger = cmp.Or(st.Logger, c.cfg.Logger)
			if st.Grace <= 0 {
				st.Grace = scanner.Grace(grace, conn.Publisher.Limits())
			}
			parts.Stats = &st
		}
		// Recorded as delaybridge run records itself, so status sees a
		// live relay; the consumer's record is its own.
		pc := c.cfg.Presence
		pc.Logger = cmp.Or(pc.Logger, c.cfg.Logger)
		parts.Presence, parts.PresenceConfig = &topo, pc
	}
	bg, err := services.New(ctx, c.db, conn.Publisher, parts)
	if err != nil {
		return err
	}
	bg.Start()
	c.bg = bg
	return nil
}

// stopBackground stops what startBackground started and waits for it
// until ctx is done: the relay ends after its batch in flight, the
// scanner after its pass, but a business source's Query or Handle is the
// caller's code. Then it withdraws the relay's presence record.
func (c *Client) stopBackground(ctx context.Context) error {
	if c.bg == nil {
		return nil
	}
	bg := c.bg
	c.bg = nil
	bg.Stop()
	err := c.waitBackground(ctx, bg)
	if werr := bg.Withdraw(ctx); werr != nil {
		c.cfg.Logger.Warn("delaybridge: withdrawing the relay's presence failed; it expires on its own", "err", werr)
	}
	return err
}

func (c *Client) waitBackground(ctx context.Context, bg *services.Group) error {
	if bg.Wait(ctx) == nil {
		return nil
	}
	// An idle relay or scanner ends within moments of its cancel, which a
	// ctx done before Stop began gave it no time for.
	wctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if bg.Wait(wctx) == nil {
		return nil
	}
	return fmt.Errorf("delaybridge: stop: a background service (relay, scanner, cleaner or counts) is still running: %w", ctx.Err())
}

// cleanupTimeout bounds each step of undoing a failed Start, which runs
// under the Client's lock: a handler that ignores its context must not
// hold Start, and every Stop and Handle behind it, forever.
const cleanupTimeout = 10 * time.Second

// undoStart stops what a failed Start had started, each step bounded by
// cleanupTimeout.
func (c *Client) undoStart() {
	bounded := func(f func(context.Context)) {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		f(ctx)
	}
	if c.consumer != nil {
		bounded(func(ctx context.Context) { _ = c.consumer.Close(ctx) })
		c.consumer = nil
	}
	if c.presence != nil {
		bounded(func(ctx context.Context) { _ = c.presence.Close(ctx) })
		c.presence = nil
	}
	bounded(func(ctx context.Context) { _ = c.stopBackground(ctx) })
}

// Stop drains: the relay, scanner and cleaner finish their batch and the
// relay's presence record is withdrawn; the consumer stops taking
// messages and waits for running handlers until ctx is done (deliveries
// not acked are redelivered later), and its presence record is
// withdrawn; then the broker connection closes. ctx bounds the
// waiting: pass one with a timeout (a context already cancelled, such as
// the signal context that ended the service, stops at once: running
// handlers are cancelled, and an idle Client stops cleanly). A stopped
// Client cannot start again; Schedule and friends keep working.
func (c *Client) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	c.stopped = true
	errs := []error{c.stopBackground(ctx)}
	if c.consumer != nil {
		errs = append(errs, c.consumer.Close(ctx))
	}
	if c.presence != nil {
		// Bounded on its own: a database gone at shutdown must not hold
		// Stop, and the record expires anyway.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := c.presence.Close(pctx); err != nil {
			c.cfg.Logger.Warn("delaybridge: withdrawing the consumer's presence failed; it expires on its own", "err", err)
		}
		cancel()
	}
	if c.conn != nil {
		c.conn.Close()
	}
	return errors.Join(errs...)
}
