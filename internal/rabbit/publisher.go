package rabbit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// Publisher publishes messages into the ladder or the delayed-message
// exchange with persistent delivery, mandatory routing and pipelined
// publisher confirms. Each of Config.Channels goroutines owns a connection
// and its confirm channel; Publish hands a call's messages to whichever is
// free and waits for the confirms, so many callers share the windows of
// unconfirmed messages. When the connection drops, every
// message still awaiting its confirm is reported failed with
// ErrConnectionLost, and the Publisher reconnects with backoff.
//
// A Publisher is safe for concurrent use. Close it when done.
type Publisher struct {
	cfg    Config
	topo   topology
	limits broker.Limits
	log    *slog.Logger

	reqs      chan *pubRequest
	stop      chan struct{}
	wg        sync.WaitGroup // the owner goroutines
	done      chan struct{}  // closed when they all ended
	closeOnce sync.Once
	loops     []*pubLoop

	idBase string
	seq    atomic.Uint64
}

// outMsg is one message ready for the wire.
type outMsg struct {
	topic     string
	exchange  string
	key       string
	mandatory bool
	pub       amqp.Publishing
}

// pubRequest is one Publish call on its way through the owner goroutine.
// The owner writes res and left; the caller reads res only after done closed.
type pubRequest struct {
	ctx  context.Context
	msgs []outMsg
	idx  []int
	res  []error
	left int
	done chan struct{}
}

func (r *pubRequest) settle(i int, err error) {
	r.res[i] = err
	r.left--
	if r.left == 0 {
		close(r.done)
	}
}

// NewPublisher connects to the broker, declares the shared topology of the
// configured mode and returns a Publisher. In ModeDelayedExchange it fails
// with ErrPluginMissing when the broker lacks the plugin.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Publisher{
		cfg:    cfg,
		topo:   topology{cfg: cfg},
		limits: cfg.limits(),
		log:    cfg.Logger,
		reqs:   make(chan *pubRequest),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		idBase: strconv.FormatInt(time.Now().UnixNano(), 36) + "-",
	}
	loops := make([]*pubLoop, cfg.Channels)
	for i := range loops {
		l := &pubLoop{p: p, role: fmt.Sprintf("publisher %d", i), pending: map[uint64]pendingMsg{}, returned: map[string]string{}, declared: map[string]bool{}}
		conn, err := dialRecording(ctx, cfg, l.role, &l.sock)
		if err == nil {
			if err = l.attach(conn); err != nil {
				closeQuietly(conn)
			}
		}
		if err != nil {
			for _, l := range loops[:i] {
				closeQuietly(l.conn)
			}
			return nil, err
		}
		loops[i] = l
	}
	p.loops = loops
	p.wg.Add(len(loops))
	for _, l := range loops {
		go l.run()
	}
	go func() { p.wg.Wait(); close(p.done) }()
	return p, nil
}

// Limits returns what one hop may do: in ladder mode MaxHop is Unit ×
// (2^Depth − 1) and Precision is Unit + Lead.
func (p *Publisher) Limits() broker.Limits { return p.limits }

// Close stops the Publisher, fails what is still unconfirmed with
// broker.ErrClosed and closes the connection. It waits for the owner
// goroutines to end: at most about closeGrace and the close handshake's
// wait, even while the broker has blocked the connections (a memory or
// disk alarm), when their sockets are closed under them.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() { close(p.stop) })
	t := time.NewTimer(closeGrace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	}
	// A loop still running is stuck writing to a broker that stopped
	// reading: closing its socket fails the write, and the loop ends.
	for _, l := range p.loops {
		if w := l.sock.Load(); w != nil {
			_ = w.Close()
		}
	}
	<-p.done
	return nil
}

// closeGrace is how long Close lets the owner goroutines end on their own,
// and how long a loop's close handshake may wait for the broker.
const closeGrace = 5 * time.Second

// Publish sends msgs, each to be delivered at its next hop as Limits().Plan
// plans it, and waits for the broker's confirms. See broker.Publisher.
func (p *Publisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	select {
	case <-p.stop:
		return broker.ErrClosed
	default:
	}
	failed := map[int]error{}
	now := time.Now()
	req := &pubRequest{ctx: ctx, done: make(chan struct{})}
	for i, m := range msgs {
		if err := m.Validate(); err != nil {
			failed[i] = errors.Join(broker.ErrRejected, err)
			continue
		}
		if len(m.Payload) > broker.MaxBody {
			// Every subscriber refuses it as malformed: published, it
			// would come back from the scanner for ever.
			failed[i] = fmt.Errorf("%w: payload of %d bytes, more than the %d a consumer accepts", broker.ErrRejected, len(m.Payload), broker.MaxBody)
			continue
		}
		req.msgs = append(req.msgs, p.prepare(m, p.limits.Plan(now, m.DeliverAt).Delay))
		req.idx = append(req.idx, i)
	}
	if len(req.msgs) > 0 {
		req.res = make([]error, len(req.msgs))
		req.left = len(req.msgs)
		select {
		case p.reqs <- req:
		case <-ctx.Done():
			return fmt.Errorf("rabbit: publish: %w", ctx.Err())
		case <-p.done:
			return broker.ErrClosed
		}
		select {
		case <-req.done:
		case <-ctx.Done():
			// Some may still be confirmed; reporting them failed is safe.
			return fmt.Errorf("rabbit: publish: waiting for confirms: %w", ctx.Err())
		}
		for j, err := range req.res {
			if err != nil {
				failed[req.idx[j]] = err
			}
		}
	}
	if len(failed) > 0 {
		return &broker.PublishError{Failed: failed}
	}
	return nil
}

// prepare builds the AMQP publishing of m delayed by d.
func (p *Publisher) prepare(m *broker.Message, d time.Duration) outMsg {
	var n uint64
	var exchange, key string
	if p.cfg.Mode != ModeDelayedExchange {
		exchange, key, n = p.topo.ladderRoute(d, m.Topic)
	}
	// Room for the ladder's marks (the set bits below the entry level) and
	// CC, so the table never grows while it is filled.
	h := envelopeTable(m, bits.OnesCount64(n))
	o := outMsg{topic: m.Topic, pub: amqp.Publishing{
		Headers:      h,
		ContentType:  "application/octet-stream",
		DeliveryMode: amqp.Persistent,
		MessageId:    p.idBase + strconv.FormatUint(p.seq.Add(1), 36),
		Timestamp:    time.Now(),
		Body:         m.Payload,
	}}
	if p.cfg.Mode == ModeDelayedExchange {
		var ms int64
		o.exchange, o.key, ms = p.topo.delayedRoute(d, m.Topic)
		if ms > 0 {
			h["x-delay"] = ms
		}
		return o
	}
	o.exchange, o.key = exchange, key
	if n > 0 {
		setBits(h, n)
		h["CC"] = []any{m.Topic}
	}
	o.mandatory = true
	return o
}

// pendingMsg is a published message awaiting its confirm.
type pendingMsg struct {
	req *pubRequest
	i   int
	id  string
}

// pubLoop is the state of the owner goroutine. Nothing else touches it but
// sock, which Close may close under a loop stuck in a write.
type pubLoop struct {
	p        *Publisher
	role     string // connection name suffix
	sock     atomic.Pointer[writeBehindConn]
	conn     *amqp.Connection
	ch       *amqp.Channel // confirm mode, publishes only
	topoCh   *amqp.Channel // declarations, so a refused one cannot kill ch
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closed   chan *amqp.Error

	pending  map[uint64]pendingMsg
	returned map[string]string // message id → why the broker returned it
	declared map[string]bool   // topics whose queue is declared

	cur  *pubRequest
	next int
}

// attach opens the channels on conn and declares the shared topology.
func (l *pubLoop) attach(conn *amqp.Connection) error {
	topoCh, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbit: open channel: %w", err)
	}
	if err := l.p.topo.declare(topoCh); err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbit: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("rabbit: confirm mode: %w", err)
	}
	// Buffers hold a full window so the library's reader never blocks on us.
	w := l.p.cfg.ConfirmWindow + 1
	l.confirms = ch.NotifyPublish(make(chan amqp.Confirmation, w))
	l.returns = ch.NotifyReturn(make(chan amqp.Return, w))
	l.closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	l.conn, l.ch, l.topoCh = conn, ch, topoCh
	return nil
}

func (l *pubLoop) run() {
	p := l.p
	defer p.wg.Done()
	for {
		if l.ch == nil && !l.reconnect() {
			l.shutdown()
			return
		}
		l.pump()
		if l.ch == nil {
			continue
		}
		var reqs chan *pubRequest
		if l.cur == nil {
			reqs = p.reqs
		}
		select {
		case <-p.stop:
			l.shutdown()
			return
		case r := <-reqs:
			l.cur, l.next = r, 0
		case c, ok := <-l.confirms:
			if !ok {
				l.lost(errors.New("channel closed"))
				continue
			}
			l.confirm(c)
		case r, ok := <-l.returns:
			if !ok {
				l.returns = nil
				continue
			}
			l.returned[r.MessageId] = fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
		case e, ok := <-l.closed:
			if !ok || e == nil {
				l.lost(errors.New("channel closed"))
			} else {
				l.lost(e)
			}
		}
	}
}

// pump publishes the current request's messages while the window has room.
func (l *pubLoop) pump() {
	for l.cur != nil && l.ch != nil && len(l.pending) < l.p.cfg.ConfirmWindow {
		r, i := l.cur, l.next
		if i == len(r.msgs) {
			l.cur = nil
			return
		}
		l.next++
		if err := r.ctx.Err(); err != nil {
			r.settle(i, fmt.Errorf("rabbit: publish: %w", err))
			continue
		}
		m := &r.msgs[i]
		if !l.declared[m.topic] {
			if err := l.declareTopic(m.topic); err != nil {
				r.settle(i, err)
				continue
			}
			if len(l.declared) >= broker.MaxTrackedTopics {
				clear(l.declared) // declaring again is idempotent and cheap
			}
			l.declared[m.topic] = true
		}
		tag := l.ch.GetNextPublishSeqNo()
		// The caller's context was checked above. Given to the client, a
		// context that ended since (during a topic's declaration) failed
		// the publish as if the channel had, and the channel went down
		// with every other caller's unconfirmed messages.
		if err := l.ch.PublishWithContext(context.WithoutCancel(r.ctx), m.exchange, m.key, m.mandatory, false, m.pub); err != nil {
			r.settle(i, fmt.Errorf("%w: %w", ErrConnectionLost, err))
			l.lost(err)
			return
		}
		l.pending[tag] = pendingMsg{req: r, i: i, id: m.pub.MessageId}
	}
}

// declareTopic declares topic's consumer queue, so messages published before
// any consumer subscribed wait in it rather than in the parking queue.
func (l *pubLoop) declareTopic(topic string) error {
	if l.topoCh == nil || l.topoCh.IsClosed() {
		ch, err := l.conn.Channel()
		if err != nil {
			return fmt.Errorf("rabbit: open channel: %w", err)
		}
		l.topoCh = ch
	}
	ch, err := l.p.topo.declareTopic(l.conn, l.topoCh, topic)
	l.topoCh = ch
	return err
}

// confirm settles the message a confirm is for. A basic.return always comes
// before the ack of the same message and the library's reader hands them
// over in that order, so draining the returns first sees any return for it.
func (l *pubLoop) confirm(c amqp.Confirmation) {
	l.drainReturns()
	pm, ok := l.pending[c.DeliveryTag]
	if !ok {
		return
	}
	delete(l.pending, c.DeliveryTag)
	var err error
	why, returned := l.returned[pm.id]
	// Forget the return whatever the confirm says: a message both returned
	// and nacked would otherwise leave its entry behind for good.
	delete(l.returned, pm.id)
	switch {
	case !c.Ack:
		err = ErrNacked
	case returned:
		err = fmt.Errorf("%w: %s", ErrUnroutable, why)
		// Its queue is gone (deleted by hand, say): the next publish to the
		// topic declares it again rather than trust what was declared.
		delete(l.declared, pm.req.msgs[pm.i].topic)
	}
	pm.req.settle(pm.i, err)
}

func (l *pubLoop) drainReturns() {
	for {
		select {
		case r, ok := <-l.returns:
			if !ok {
				l.returns = nil
				return
			}
			l.returned[r.MessageId] = fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
		default:
			return
		}
	}
}

// lost settles what was confirmed before the channel died, fails every other
// pending message with ErrConnectionLost and drops the connection.
func (l *pubLoop) lost(cause error) {
	for done := false; !done; {
		select {
		case c, ok := <-l.confirms:
			if !ok {
				done = true
			} else {
				l.confirm(c)
			}
		default:
			done = true
		}
	}
	if len(l.pending) > 0 {
		l.p.log.Warn("rabbit: publisher lost its channel; unconfirmed messages reported failed", "unconfirmed", len(l.pending), "err", cause)
	} else {
		l.p.log.Warn("rabbit: publisher lost its channel; reconnecting", "err", cause)
	}
	for tag, pm := range l.pending {
		pm.req.settle(pm.i, fmt.Errorf("%w: %v", ErrConnectionLost, cause))
		delete(l.pending, tag)
	}
	clear(l.returned)
	// The broker may come back without the topic queues (a node reset):
	// declare each again on its next publish.
	clear(l.declared)
	closeQuietly(l.conn)
	l.conn, l.ch, l.topoCh = nil, nil, nil
	l.confirms, l.returns, l.closed = nil, nil, nil
}

// reconnect dials until it succeeds or the Publisher closes.
func (l *pubLoop) reconnect() bool {
	p := l.p
	b := newBackoff(p.cfg.ReconnectMax)
	for {
		wait := b.NextBackOff()
		t := time.NewTimer(wait)
		select {
		case <-p.stop:
			t.Stop()
			return false
		case <-t.C:
		}
		conn, err := dialRecording(context.Background(), p.cfg, l.role, &l.sock)
		if err == nil {
			if err = l.attach(conn); err != nil {
				closeQuietly(conn)
			}
		}
		if err == nil {
			p.log.Info("rabbit: publisher reconnected")
			return true
		}
		p.log.Warn("rabbit: publisher reconnect failed", "err", err)
	}
}

// shutdown fails everything not yet confirmed with broker.ErrClosed.
func (l *pubLoop) shutdown() {
	for tag, pm := range l.pending {
		pm.req.settle(pm.i, broker.ErrClosed)
		delete(l.pending, tag)
	}
	if r := l.cur; r != nil {
		for i := l.next; i < len(r.msgs); i++ {
			r.settle(i, broker.ErrClosed)
		}
		l.cur = nil
	}
	closeWithin(l.conn, closeGrace)
}
