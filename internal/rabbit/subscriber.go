package rabbit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// errStale is returned when a delivery is settled after the channel it came
// on is gone; the broker has already put the message back.
var errStale = errors.New("rabbit: delivery's channel is closed; the broker redelivers the message")

// Subscriber consumes topics' queues with manual acks and a prefetch. Each
// subscription owns one connection and channel in one goroutine; acks and
// nacks are handed to that goroutine. When the connection drops, the
// subscription reconnects with backoff and resumes consuming; deliveries of
// the dead channel can no longer be settled (their Ack and Nack return an
// error) and the broker redelivers them.
//
// Two subscriptions of the same topic, in one Subscriber or several, compete
// for the messages of one queue. A Subscriber is safe for concurrent use.
type Subscriber struct {
	cfg  Config
	topo topology
	log  *slog.Logger

	mu     sync.Mutex
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup
}

// NewSubscriber checks cfg and returns a Subscriber. It connects only when
// Subscribe is called.
func NewSubscriber(cfg Config) (*Subscriber, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Subscriber{cfg: cfg, topo: topology{cfg: cfg}, log: cfg.Logger, stop: make(chan struct{})}, nil
}

// Close ends every subscription: their channels close, the broker requeues
// every unacked delivery, and Close waits for their goroutines.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.stop)
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// Subscribe declares the topology and topic's queue, starts consuming it and
// returns its deliveries. The channel closes when ctx is done or the
// Subscriber is closed. After ctx is done the subscription keeps its channel
// open until every delivery it handed out is settled (or the Subscriber
// closes), so acks after a graceful stop still count.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *broker.Delivery, error) {
	if err := broker.ValidateTopic(topic); err != nil {
		return nil, err
	}
	sub := &subscription{
		s: s, topic: topic,
		out:    make(chan *broker.Delivery),
		settle: make(chan settleReq),
		done:   make(chan struct{}),
	}
	if err := sub.connect(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		closeQuietly(sub.conn)
		return nil, broker.ErrClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go sub.run(ctx)
	return sub.out, nil
}

// settleReq asks the owner goroutine to ack or nack one delivery.
type settleReq struct {
	gen uint64
	tag uint64
	ack bool
	res chan error
}

// subscription is one consumer of one topic queue.
type subscription struct {
	s      *Subscriber
	topic  string
	out    chan *broker.Delivery
	settle chan settleReq
	done   chan struct{}

	// Owned by the run goroutine after Subscribe returns.
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
	gen        uint64
	tag        string
}

// connect opens a connection and channel, declares, and starts consuming.
func (sub *subscription) connect(ctx context.Context) error {
	s := sub.s
	conn, err := dial(ctx, s.cfg, "subscriber "+sub.topic)
	if err != nil {
		return err
	}
	fail := func(err error) error { closeQuietly(conn); return err }
	ch, err := conn.Channel()
	if err != nil {
		return fail(fmt.Errorf("rabbit: open channel: %w", err))
	}
	if err := s.topo.declare(ch); err != nil {
		return fail(err)
	}
	if ch, err = s.topo.declareTopic(conn, ch, sub.topic); err != nil {
		return fail(err)
	}
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return fail(fmt.Errorf("rabbit: qos: %w", err))
	}
	sub.gen++
	sub.tag = fmt.Sprintf("delaybridge-%s-%d-%d", sub.topic, time.Now().UnixNano(), sub.gen)
	d, err := ch.Consume(s.topo.topicQueue(sub.topic), sub.tag, false, false, false, false, nil)
	if err != nil {
		return fail(fmt.Errorf("rabbit: consume %s: %w", s.topo.topicQueue(sub.topic), err))
	}
	sub.conn, sub.ch, sub.deliveries = conn, ch, d
	return nil
}

// run is the owner goroutine: it hands deliveries out, settles them, and
// reconnects when the connection drops.
func (sub *subscription) run(ctx context.Context) {
	s := sub.s
	defer s.wg.Done()
	defer close(sub.done)
	var (
		pending     *broker.Delivery // converted, not yet handed out
		outstanding = map[uint64]bool{}
		stopping    bool // ctx done: hand out nothing more
		retry       <-chan time.Time
		b           = newBackoff(s.cfg.ReconnectMax)
		ctxDone     = ctx.Done()
	)
	defer func() { closeQuietly(sub.conn) }()
	closeOut := sync.OnceFunc(func() { close(sub.out) })
	defer closeOut()
	for {
		if stopping && (len(outstanding) == 0 || sub.ch == nil) {
			return
		}
		var out chan *broker.Delivery
		var in <-chan amqp.Delivery
		if pending != nil && !stopping {
			out = sub.out
		} else if sub.ch != nil {
			in = sub.deliveries
		}
		select {
		case <-s.stop:
			return
		case <-ctxDone:
			ctxDone = nil
			stopping = true
			closeOut()
			if sub.ch != nil {
				// Stop new deliveries; what was prefetched and not handed
				// out goes back when the channel closes.
				_ = sub.ch.Cancel(sub.tag, false)
			}
			pending = nil
		case out <- pending:
			outstanding[pending.Acker.(*acker).tag] = true
			pending = nil
		case d, ok := <-in:
			if !ok && stopping && sub.conn != nil && !sub.conn.IsClosed() {
				// Cancel closed the stream; keep the channel for acks.
				sub.deliveries = nil
				continue
			}
			if !ok {
				sub.lost(outstanding)
				pending = nil
				if !stopping {
					retry = time.After(b.NextBackOff())
				}
				continue
			}
			if stopping {
				continue // requeued when the channel closes
			}
			pending = sub.convert(d)
		case r := <-sub.settle:
			r.res <- sub.doSettle(r, outstanding)
		case <-retry:
			retry = nil
			if err := sub.connect(context.Background()); err != nil {
				s.log.Warn("rabbit: subscriber reconnect failed", "topic", sub.topic, "err", err)
				retry = time.After(b.NextBackOff())
				continue
			}
			b.Reset()
			s.log.Info("rabbit: subscriber reconnected", "topic", sub.topic)
		}
	}
}

// lost drops the dead connection: its deliveries can no longer be settled.
func (sub *subscription) lost(outstanding map[uint64]bool) {
	reason := "deliveries channel closed"
	if sub.conn != nil && sub.conn.IsClosed() {
		reason = "connection closed"
	}
	sub.s.log.Warn("rabbit: subscriber lost its channel; reconnecting", "topic", sub.topic, "reason", reason, "unsettled", len(outstanding))
	closeQuietly(sub.conn)
	sub.conn, sub.ch, sub.deliveries = nil, nil, nil
	clear(outstanding)
}

func (sub *subscription) doSettle(r settleReq, outstanding map[uint64]bool) error {
	if r.gen != sub.gen || sub.ch == nil || !outstanding[r.tag] {
		return errStale
	}
	delete(outstanding, r.tag)
	var err error
	if r.ack {
		err = sub.ch.Ack(r.tag, false)
	} else {
		err = sub.ch.Nack(r.tag, false, true)
	}
	if err != nil {
		return fmt.Errorf("rabbit: settle delivery: %w", err)
	}
	return nil
}

// convert turns an AMQP delivery into a broker delivery.
func (sub *subscription) convert(d amqp.Delivery) *broker.Delivery {
	h, err := fromTable(d.Headers)
	out := &broker.Delivery{Headers: h, Body: d.Body, Acker: &acker{sub: sub, gen: sub.gen, tag: d.DeliveryTag}}
	if err != nil {
		out.Err = err
		return out
	}
	out.Message, out.Err = broker.Decode(h, d.Body)
	return out
}

// acker settles one delivery through its subscription's owner goroutine.
type acker struct {
	sub  *subscription
	gen  uint64
	tag  uint64
	used atomic.Bool
}

// Ack acknowledges the delivery.
func (a *acker) Ack() error { return a.do(true) }

// Nack requeues the delivery.
func (a *acker) Nack() error { return a.do(false) }

func (a *acker) do(ack bool) error {
	if a.used.Swap(true) {
		return errors.New("rabbit: delivery already settled")
	}
	r := settleReq{gen: a.gen, tag: a.tag, ack: ack, res: make(chan error, 1)}
	select {
	case a.sub.settle <- r:
	case <-a.sub.done:
		return errStale
	}
	return <-r.res
}
