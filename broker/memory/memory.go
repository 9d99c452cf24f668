// Package memory is an in-memory broker that implements broker.Publisher and
// broker.Subscriber for unit tests and examples. It keeps the rules a real
// adapter keeps: messages travel through the envelope codec, a hop never
// exceeds the limits, unacked messages go back to the queue when a
// subscription ends, and a prefetch bounds the unacked messages of each
// subscription. Nothing survives the process.
package memory

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// Config configures a Broker. Zero values mean the defaults stated.
type Config struct {
	// Limits are what one hop may do. Default: no MaxHop, 1ms precision.
	Limits broker.Limits
	// Early makes every delayed hop arrive this much before it is due, to
	// imitate a broker whose precision lets messages out early. Keep it
	// within Limits.Precision.
	Early time.Duration
	// Prefetch bounds the unacked deliveries of one subscription. Default 64.
	Prefetch int
	// BeforePublish, when set, is called for every message about to be
	// stored; an error fails that message as the broker refusing it would.
	BeforePublish func(m *broker.Message) error
}

// Broker is the in-memory broker. The zero value is not usable; call New.
type Broker struct {
	cfg Config

	mu     sync.Mutex
	cond   *sync.Cond
	queues map[string][]*entry
	timers map[*time.Timer]struct{}
	closed bool
	stats  Stats
}

// Stats counts what went through a Broker.
type Stats struct {
	Published int // messages stored, every hop counted
	Delivered int // deliveries handed to subscribers, redeliveries counted
	Acked     int
	Nacked    int
}

type entry struct {
	headers map[string]string
	body    []byte
}

// New returns an empty Broker.
func New(cfg Config) *Broker {
	if cfg.Prefetch <= 0 {
		cfg.Prefetch = 64
	}
	b := &Broker{cfg: cfg, queues: map[string][]*entry{}, timers: map[*time.Timer]struct{}{}}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// Limits returns the configured limits.
func (b *Broker) Limits() broker.Limits { return b.cfg.Limits }

// Stats returns a snapshot of the counters.
func (b *Broker) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// Ready returns how many messages of topic wait for a subscriber, not
// counting delayed or unacked ones.
func (b *Broker) Ready(topic string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queues[topic])
}

// Publish stores each message after its planned hop delay. It checks each
// message the way a real adapter must and reports the invalid ones as
// rejected; the rest are "confirmed" when stored.
func (b *Broker) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	failed := map[int]error{}
	now := time.Now()
	for i, m := range msgs {
		if err := m.Validate(); err != nil {
			failed[i] = errors.Join(broker.ErrRejected, err)
			continue
		}
		if b.cfg.BeforePublish != nil {
			if err := b.cfg.BeforePublish(m); err != nil {
				failed[i] = err
				continue
			}
		}
		hop := b.cfg.Limits.Plan(now, m.DeliverAt)
		delay := hop.Delay
		if delay > 0 && b.cfg.Early > 0 {
			delay = max(delay-b.cfg.Early, 0)
		}
		if err := b.store(m.Topic, &entry{headers: broker.Encode(m), body: append([]byte(nil), m.Payload...)}, delay); err != nil {
			failed[i] = err
		}
	}
	if len(failed) > 0 {
		return &broker.PublishError{Failed: failed}
	}
	return nil
}

// PublishRaw stores a message with exactly these headers and body, as a
// foreign producer would, for delivery at once.
func (b *Broker) PublishRaw(topic string, headers map[string]string, body []byte) error {
	return b.store(topic, &entry{headers: maps.Clone(headers), body: body}, 0)
}

func (b *Broker) store(topic string, e *entry, delay time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return broker.ErrClosed
	}
	b.stats.Published++
	if delay <= 0 {
		b.queues[topic] = append(b.queues[topic], e)
		b.cond.Broadcast()
		return nil
	}
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.timers, t)
		if b.closed {
			return
		}
		b.queues[topic] = append(b.queues[topic], e)
		b.cond.Broadcast()
	})
	b.timers[t] = struct{}{}
	return nil
}

// Subscribe delivers the ready messages of topic, competing with any other
// subscription of the same topic.
func (b *Broker) Subscribe(ctx context.Context, topic string) (<-chan *broker.Delivery, error) {
	if err := broker.ValidateTopic(topic); err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, broker.ErrClosed
	}
	b.mu.Unlock()
	s := &subscription{b: b, topic: topic, unacked: map[*acker]struct{}{}}
	out := make(chan *broker.Delivery)
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		b.cond.Broadcast()
		b.mu.Unlock()
	})
	go func() {
		defer close(out)
		defer stop()
		defer s.requeueAll()
		for {
			e, a := s.next(ctx)
			if e == nil {
				return
			}
			d := &broker.Delivery{Headers: maps.Clone(e.headers), Body: e.body, Acker: a}
			d.Message, d.Err = broker.Decode(e.headers, e.body)
			select {
			case out <- d:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// Close drops every message and stops every subscription.
func (b *Broker) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for t := range b.timers {
		t.Stop()
	}
	b.timers = nil
	b.cond.Broadcast()
	return nil
}

type subscription struct {
	b       *Broker
	topic   string
	unacked map[*acker]struct{}
}

// next waits for a ready message and room under the prefetch.
func (s *subscription) next(ctx context.Context) (*entry, *acker) {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if ctx.Err() != nil || b.closed {
			return nil, nil
		}
		if q := b.queues[s.topic]; len(q) > 0 && len(s.unacked) < b.cfg.Prefetch {
			e := q[0]
			q[0] = nil
			b.queues[s.topic] = q[1:]
			a := &acker{s: s, e: e}
			s.unacked[a] = struct{}{}
			b.stats.Delivered++
			return e, a
		}
		b.cond.Wait()
	}
}

// requeueAll gives back every unacked delivery when the subscription ends.
func (s *subscription) requeueAll() {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	for a := range s.unacked {
		a.done = true
		b.queues[s.topic] = append([]*entry{a.e}, b.queues[s.topic]...)
	}
	clear(s.unacked)
	b.cond.Broadcast()
}

type acker struct {
	s    *subscription
	e    *entry
	done bool
}

func (a *acker) settle(requeue bool) error {
	b := a.s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if a.done {
		return fmt.Errorf("memory: delivery already settled or given back: %w", broker.ErrClosed)
	}
	a.done = true
	delete(a.s.unacked, a)
	if requeue {
		b.stats.Nacked++
		b.queues[a.s.topic] = append(b.queues[a.s.topic], a.e)
	} else {
		b.stats.Acked++
	}
	b.cond.Broadcast()
	return nil
}

func (a *acker) Ack() error  { return a.settle(false) }
func (a *acker) Nack() error { return a.settle(true) }
