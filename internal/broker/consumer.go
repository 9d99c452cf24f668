package broker

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Consumer is the runtime between a Subscriber and a Handler. It never runs
// a handler before DeliverAt, acks only after the handler returned nil,
// retries failures with backoff by publishing them again, and dead-letters
// poison messages without blocking the ones behind them.
type Consumer struct {
	sub  Subscriber
	pub  Publisher
	h    Handler
	cfg  ConsumerConfig
	log  *slog.Logger
	work *workQueue

	subCtx    context.Context // cancelled when Close starts: stop taking messages
	stopSub   context.CancelFunc
	hardCtx   context.Context // cancelled when Close gives up waiting
	stopHard  context.CancelFunc
	stopping  chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	stuck   atomic.Int64 // abandoned handlers still running
	running atomic.Int64 // handler (and group handler) calls not yet returned

	mu       sync.Mutex
	started  bool
	closed   bool
	held     heldQueue     // early messages waiting to come due (hold)
	heldSeq  uint64        // arrival order of held messages
	wakeHeld chan struct{} // a message was held ahead of the others

	gates map[string]*gate // by topic, for a TopicPolicy's Rate or Concurrency
}

// gate is what a topic's deliveries pass before its handler: a rate
// window, a bound on how many are in progress at once, or both.
type gate struct {
	rate  *window       // nil: no Rate
	slots chan struct{} // nil: no Concurrency; one element per delivery in progress
}

// window lets n deliveries through in each window of length size
// (n/size is the topic's Rate), starting a window with the first delivery
// after the last one ended. Deliveries let through together go to the
// handler together, as a group, where tokens trickling in one at a time
// would make each its own transaction. Only its topic's dispatch loop
// uses it.
type window struct {
	n     int
	size  time.Duration
	start time.Time
	used  int
}

// newWindow is the window of rate deliveries a second: a tenth of a
// second's worth at a time, or one.
func newWindow(perSecond float64) *window {
	n := max(1, int(perSecond/10))
	return &window{n: n, size: time.Duration(float64(n) / perSecond * float64(time.Second))}
}

// wait returns once a delivery may pass, or when done is closed.
func (w *window) wait(done <-chan struct{}) {
	for {
		now := time.Now()
		if now.Sub(w.start) >= w.size {
			w.start, w.used = now, 0
		}
		if w.used < w.n {
			w.used++
			return
		}
		t := time.NewTimer(w.start.Add(w.size).Sub(now))
		select {
		case <-t.C:
		case <-done:
			t.Stop()
			return
		}
	}
}

type job struct {
	topic string
	d     *Delivery
	slot  bool // holds one of its topic's Concurrency slots until settled
}

// NewConsumer builds a runtime that reads from sub, re-publishes hops and
// retries through pub and runs h. Start it with Start; stop it with Close.
func NewConsumer(sub Subscriber, pub Publisher, h Handler, cfg ConsumerConfig) (*Consumer, error) {
	if sub == nil || pub == nil || h == nil {
		return nil, errors.New("broker: NewConsumer needs a subscriber, a publisher and a handler")
	}
	if err := pub.Limits().Validate(); err != nil {
		return nil, err
	}
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults(pub)
	// Without a group handler each topic's lane holds one delivery for the
	// next free worker. With one, it holds a group, so a worker that finds
	// messages waiting can take up to GroupSize of them at once.
	queue := 1
	if cfg.Group != nil {
		queue = cfg.GroupSize
	}
	c := &Consumer{
		sub: sub, pub: pub, h: h, cfg: cfg, log: cfg.Logger,
		work:     newWorkQueue(queue),
		stopping: make(chan struct{}),
		wakeHeld: make(chan struct{}, 1),
	}
	for topic, p := range cfg.Topics {
		if p.Rate <= 0 && p.Concurrency <= 0 {
			continue
		}
		g := &gate{}
		if p.Rate > 0 {
			g.rate = newWindow(p.Rate)
		}
		if p.Concurrency > 0 {
			g.slots = make(chan struct{}, p.Concurrency)
		}
		if c.gates == nil {
			c.gates = map[string]*gate{}
		}
		c.gates[topic] = g
	}
	c.subCtx, c.stopSub = context.WithCancel(context.Background())
	c.hardCtx, c.stopHard = context.WithCancel(context.Background())
	return c, nil
}

// Start subscribes to each topic and starts the workers. It returns once
// every subscription is in place; messages are then handled in the
// background until Close.
func (c *Consumer) Start(ctx context.Context, topics ...string) error {
	if len(topics) == 0 {
		return errors.New("broker: Start needs at least one topic")
	}
	for _, t := range topics {
		if err := ValidateTopic(t); err != nil {
			return err
		}
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if c.started {
		c.mu.Unlock()
		return errors.New("broker: consumer already started")
	}
	c.started = true
	c.mu.Unlock()

	chans := make([]<-chan *Delivery, len(topics))
	for i, t := range topics {
		ch, err := c.sub.Subscribe(c.subCtx, t)
		if err == nil && ctx.Err() != nil {
			err = ctx.Err()
		}
		if err != nil {
			c.stopSub()
			return fmt.Errorf("broker: subscribe %s: %w", t, err)
		}
		chans[i] = ch
	}
	// A Close that ran while this Start subscribed found nothing to wait
	// for: counted under the lock Close sets closed under, the goroutines
	// start only if Close will wait for them.
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.stopSub()
		return ErrClosed
	}
	// With two topics or more, a spare worker serves the topics no worker
	// is on: one topic's burst keeps every worker, and another's task
	// would wait for one to finish a group.
	spare := len(chans) > 1
	c.wg.Add(c.cfg.Concurrency + 1 + len(chans))
	if spare {
		c.wg.Add(1)
		go c.worker(c.work.takeSpare)
	}
	c.mu.Unlock()
	for i := 0; i < c.cfg.Concurrency; i++ {
		go c.worker(c.work.take)
	}
	go c.releaseHeld()
	for i, ch := range chans {
		go c.dispatch(topics[i], ch)
	}
	return nil
}

// Close stops taking messages, gives back the ones held in memory, and waits
// for running handlers, abandoned ones included, until ctx is done. Then it
// cancels the handlers' context and returns ctx's error; their deliveries
// are given back when they return or are abandoned. With no handler
// running, a ctx already done still lets the consumer stop cleanly (nil).
// Messages not acked are redelivered by the broker.
func (c *Consumer) Close(ctx context.Context) error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		close(c.stopping)
		c.stopSub()
	})
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
		c.stopHard()
		return nil
	case <-ctx.Done():
	}
	if c.running.Load() > 0 {
		c.stopHard()
		return fmt.Errorf("broker: consumer close: handlers still running: %w", ctx.Err())
	}
	// No handler runs: the workers and dispatchers only have to notice the
	// stop, which a ctx done before Close began gave them no time for.
	t := time.NewTimer(closeIdleWait)
	defer t.Stop()
	select {
	case <-done:
		c.stopHard()
		return nil
	case <-t.C:
		c.stopHard()
		return fmt.Errorf("broker: consumer close: still stopping: %w", ctx.Err())
	}
}

// closeIdleWait is how long Close, its ctx done, waits for a consumer with
// no handler running to stop.
const closeIdleWait = time.Second

// dispatch reads one subscription and hands each delivery to a worker, or
// holds it first when it arrived a little early.
func (c *Consumer) dispatch(topic string, ch <-chan *Delivery) {
	defer c.wg.Done()
	g := c.gates[topic]
	for d := range ch {
		j := job{topic: topic, d: d}
		if g != nil {
			j.slot = c.admit(topic, g, d)
		}
		if d.Err == nil && d.Message != nil {
			early := d.Message.DeliverAt.Sub(c.cfg.Now())
			if early > 0 && early <= c.cfg.HoldWindow && c.hold(j, early) {
				continue
			}
		}
		c.enqueue(j)
	}
}

// admit waits, in topic's dispatch loop, until d may go to the handler
// under the topic's gate: first until it is due, when it will run here
// rather than hop, then for room in the topic's rate window, then for a
// free Concurrency slot, which it reports it took (released when the
// delivery is settled: ack or nack). Each delivery passes here once and
// counts only from its due time, so the handler never sees more than the
// rate, even of messages that arrived early together. Waiting here leaves
// the rest in the broker; other topics have loops of their own. A
// consumer that closes meanwhile stops the wait, and enqueue gives the
// delivery back.
func (c *Consumer) admit(topic string, g *gate, d *Delivery) (slot bool) {
	if d.Err != nil || d.Message == nil {
		return false // never handled: nothing to take
	}
	early := d.Message.DeliverAt.Sub(c.cfg.Now())
	if early > c.cfg.HoldWindow {
		return false // another hop, not a handler run
	}
	if early > 0 {
		t := time.NewTimer(early)
		select {
		case <-t.C:
		case <-c.subCtx.Done():
			t.Stop()
			return false
		}
	}
	due := time.Now()
	if g.rate != nil {
		g.rate.wait(c.subCtx.Done())
	}
	if g.slots != nil {
		select {
		case g.slots <- struct{}{}:
			slot = true
		case <-c.subCtx.Done():
		}
	}
	if waited := time.Since(due); waited > time.Millisecond && c.cfg.Hooks.Limited != nil {
		c.cfg.Hooks.Limited(topic, waited)
	}
	return slot
}

// release gives back j's Concurrency slot, if it holds one.
func (c *Consumer) release(j job) {
	if !j.slot {
		return
	}
	select {
	case <-c.gates[j.topic].slots:
	default:
	}
}

// hold parks j in memory until it is due, d from now. It reports false
// when the consumer is closing, in which case the caller enqueues (and so
// gives back) j.
func (c *Consumer) hold(j job, d time.Duration) bool {
	at := time.Now().Add(d) // the real clock: what timers run on
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.heldSeq++
	h := &heldJob{j: j, at: at, key: at.Round(time.Millisecond), seq: c.heldSeq}
	heap.Push(&c.held, h)
	if c.held[0] == h {
		select {
		case c.wakeHeld <- struct{}{}:
		default:
		}
	}
	return true
}

// releaseHeld hands each held message to the workers when it comes due,
// in one goroutine: messages due in the same millisecond go in the order
// they arrived, so they are settled (acked) in that order too. RabbitMQ
// pays for an ack by how many unacked deliveries of the channel precede
// it, and a burst of thousands of tasks due at one instant, released by a
// timer each in whatever order the timers fired, cost the broker more than
// the database did. On Close it gives back whatever is still held.
func (c *Consumer) releaseHeld() {
	defer c.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		c.mu.Lock()
		var due []job
		now := time.Now()
		for len(c.held) > 0 && !c.held[0].at.After(now) {
			due = append(due, heap.Pop(&c.held).(*heldJob).j)
		}
		next := time.Duration(-1)
		if len(c.held) > 0 {
			next = c.held[0].at.Sub(now)
		}
		c.mu.Unlock()
		for _, j := range due {
			c.enqueueHeld(j)
		}
		if len(due) > 0 {
			continue
		}
		if next >= 0 {
			t.Reset(next)
		}
		select {
		case <-c.stopping:
			c.nackHeld()
			return
		case <-c.wakeHeld:
		case <-t.C:
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

// nackHeld gives back every held message.
func (c *Consumer) nackHeld() {
	c.mu.Lock()
	held := c.held
	c.held = nil
	c.mu.Unlock()
	for _, h := range held {
		c.nack(h.j)
	}
}

// heldJob is a held message: released at at, ordered by key (at to the
// millisecond, which messages due together share) and then by arrival.
type heldJob struct {
	j       job
	at, key time.Time
	seq     uint64
}

// heldQueue is a min-heap of held messages (container/heap).
type heldQueue []*heldJob

func (q heldQueue) Len() int { return len(q) }
func (q heldQueue) Less(a, b int) bool {
	if !q[a].key.Equal(q[b].key) {
		return q[a].key.Before(q[b].key)
	}
	return q[a].seq < q[b].seq
}
func (q heldQueue) Swap(a, b int) { q[a], q[b] = q[b], q[a] }
func (q *heldQueue) Push(x any)   { *q = append(*q, x.(*heldJob)) }
func (q *heldQueue) Pop() any {
	old := *q
	h := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return h
}

func (c *Consumer) enqueue(j job) {
	select {
	case <-c.stopping:
		c.nack(j)
		return
	default:
	}
	if !c.work.put(j, c.stopping) {
		c.nack(j)
		return
	}
	c.stoppedMeanwhile()
}

// enqueueHeld queues j, a held message come due, without waiting for room
// in its topic's lane.
func (c *Consumer) enqueueHeld(j job) {
	select {
	case <-c.stopping:
		c.nack(j)
		return
	default:
	}
	c.work.putHeld(j)
	c.stoppedMeanwhile()
}

// stoppedMeanwhile gives back what is queued when the consumer stopped
// while a delivery was being queued: the workers may have drained the
// queue already.
func (c *Consumer) stoppedMeanwhile() {
	select {
	case <-c.stopping:
		c.drainWork()
	default:
	}
}

// drainWork gives back every delivery still queued for a worker.
func (c *Consumer) drainWork() {
	for _, j := range c.work.drain() {
		c.nack(j)
	}
}

// worker handles what take returns until the consumer stops: c.work.take
// for a worker, c.work.takeSpare for the spare one.
func (c *Consumer) worker(take func(limit func(topic string) int, stop <-chan struct{}) []job) {
	defer c.wg.Done()
	for {
		jobs := take(c.takeLimit, c.stopping)
		if jobs == nil {
			c.drainWork()
			return
		}
		c.handle(jobs)
		c.work.done(jobs[0].topic)
	}
}

// handle handles the deliveries of one take: a group of the ready ones,
// then the others one at a time.
func (c *Consumer) handle(jobs []job) {
	// Deliveries that are not ready (early, undecodable) or whose
	// topic runs alone are set aside until the group is done: a hop or
	// a dead letter waits on the broker, and the group's messages are
	// due already.
	var batch, later []job
	for _, j := range jobs {
		if c.groupable(j) {
			batch = append(batch, j)
		} else {
			later = append(later, j)
		}
	}
	// A take is of one topic and at most its GroupSize: one group.
	switch len(batch) {
	case 0:
	case 1:
		c.process(batch[0])
	default:
		c.processGroup(batch)
	}
	for _, j := range later {
		c.process(j)
	}
}

// takeLimit is how many of topic's deliveries a worker takes at once: a
// group's worth with a group handler, else one.
func (c *Consumer) takeLimit(topic string) int {
	if c.cfg.Group == nil {
		return 1
	}
	return c.cfg.policy(topic).GroupSize
}

// groupable reports whether j may go into a group: there is a group
// handler, j is ready, and its topic does not run alone.
func (c *Consumer) groupable(j job) bool {
	return c.cfg.Group != nil && c.ready(j) && c.cfg.policy(j.topic).GroupSize > 1
}

// ready reports whether j can go to the handler right now: decoded, due,
// and not beyond MaxDelay.
func (c *Consumer) ready(j job) bool {
	return j.d.Err == nil && j.d.Message != nil && j.d.Message.Topic == j.topic && !c.cfg.Now().Before(j.d.Message.DeliverAt)
}

// processGroup runs due messages through the GroupHandler in one call and
// settles each by its own result; when the group fails as a whole each
// goes through the one-at-a-time path.
func (c *Consumer) processGroup(batch []job) {
	now := c.cfg.Now()
	msgs := make([]*Message, len(batch))
	for i, j := range batch {
		c.startSpan(j.d.Message, now)
		msgs[i] = j.d.Message.Clone()
	}
	var errs []error
	start := time.Now()
	err := c.guard(batch[0].topic, c.cfg.policy(batch[0].topic).HandlerTimeout, fmt.Sprintf("a group of %d", len(msgs)), func(ctx context.Context) error {
		var err error
		errs, err = c.cfg.Group(ctx, msgs)
		if err == nil && len(errs) != len(msgs) {
			err = fmt.Errorf("group handler returned %d results for %d messages", len(errs), len(msgs))
		}
		return err
	})
	// What the group handler learnt of each message: the attempt its
	// store counts (see Message.Attempt), and whether it ran in a
	// transaction that was rolled back. An abandoned group may still be
	// writing msgs: each of its messages may have run.
	for i, j := range batch {
		m := j.d.Message
		if errors.Is(err, ErrHandlerStuck) {
			m.Rerun = true
			continue
		}
		if msgs[i].Attempt >= 0 {
			m.Attempt = msgs[i].Attempt
		}
		m.Rerun = msgs[i].Rerun
		if err == nil && m.Rerun && !errors.Is(errs[i], ErrHandleAlone) && c.cfg.Hooks.Rerun != nil {
			c.cfg.Hooks.Rerun(j.topic)
		}
	}
	// The messages the group left out (ErrHandleAlone) run one at a time
	// after it, so a row another transaction holds keeps waiting only the
	// message whose row it is.
	var grouped, alone []job
	if err == nil {
		for i, j := range batch {
			if errors.Is(errs[i], ErrHandleAlone) {
				alone = append(alone, j)
			} else {
				grouped = append(grouped, j)
			}
		}
	}
	if c.cfg.Hooks.Grouped != nil && err == nil && len(grouped) > 0 {
		// A group is of one topic (workQueue). A group that failed whole
		// committed none; its messages run one at a time.
		c.cfg.Hooks.Grouped(batch[0].topic, len(grouped), time.Since(start))
	}
	if err != nil {
		if c.hardCtx.Err() != nil {
			for _, j := range batch {
				endSpan(j.d.Message, "released", "shutdown", err)
				c.nack(j)
			}
			return
		}
		if errors.Is(err, ErrUnavailable) {
			// One at a time they would each wait for the database and
			// pause in turn: give the group back after one pause.
			c.log.Warn("delaybridge: the handler's database is unavailable; giving the group back", "messages", len(batch), "err", err)
			c.pause()
			for _, j := range batch {
				endSpan(j.d.Message, "released", "unavailable", err)
				c.nack(j)
			}
			return
		}
		c.log.Info("delaybridge: group failed; handling its messages one at a time", "messages", len(batch), "err", err)
		for _, j := range batch {
			c.process(j)
		}
		return
	}
	for i, j := range batch {
		if !errors.Is(errs[i], ErrHandleAlone) {
			c.settle(j, errs[i], now.Sub(j.d.Message.DeliverAt))
		}
	}
	for _, j := range alone {
		if c.hardCtx.Err() != nil {
			endSpan(j.d.Message, "released", "shutdown", nil)
			c.nack(j)
			continue
		}
		c.process(j)
	}
}

// process settles one delivery: dead, hop, wait, or run the handler.
func (c *Consumer) process(j job) {
	d := j.d
	if d.Err != nil || d.Message == nil {
		reason := d.Err
		if reason == nil {
			reason = ErrNoEnvelope
		}
		c.dead(j, reason)
		return
	}
	m := d.Message
	if m.Topic != j.topic {
		// Only the subscription says which topic a queue serves; a message
		// naming another is refused whole: no handler, no hop, no re-publish
		// into that topic's queue.
		c.dead(j, fmt.Errorf("%w: delivered on %q, names %q", ErrWrongTopic, j.topic, m.Topic))
		return
	}
	now := c.cfg.Now()
	remaining := m.DeliverAt.Sub(now)
	if remaining > c.cfg.MaxDelay {
		c.dead(j, fmt.Errorf("%w: due %s is more than MaxDelay (%v) away", ErrTooFar, m.DeliverAt.Format(time.RFC3339), c.cfg.MaxDelay))
		return
	}
	if remaining > 0 {
		c.wait(j, m, now, remaining)
		return
	}
	c.startSpan(m, now)
	c.settle(j, c.run(m), now.Sub(m.DeliverAt))
}
