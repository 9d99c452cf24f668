package rabbit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Small ladders keep the tests short: 250ms × (2^4 − 1) = 3.75s per hop,
// with a lead well inside one hop, so delays go through the ladder.
const (
	testUnit  = 250 * time.Millisecond
	testDepth = 4
	testLead  = 200 * time.Millisecond
)

// brokerClockSlack is how much earlier than planned a raw delivery may
// reach a test that times a broker delay d itself. RabbitMQ times message
// TTLs and the plugin's delays by the Erlang VM's clock, the test by Go's.
// After the host's clock jumps (a paused virtual machine), Erlang does not
// jump with it but runs up to 1 % fast until it has caught up: measured on
// this box on 2026-12-03, 10.0046 s of Erlang monotonic time against
// 9.9079 s of the OS clock, and deliveries 0.3 to 8.8 ms early over 1.5 to
// 3.25 s in the tests below. What they guard against (a wrong level, a
// delay sent as none) is a unit (250 ms) or more early. Never early for a
// task is the consumer's, which holds a message until due by its own
// clock and the database's.
func brokerClockSlack(d time.Duration) time.Duration { return 5*time.Millisecond + d/100 }

// bundle is what a test against the real broker needs.
type bundle struct {
	tb  testing.TB
	cfg Config
	mu  sync.Mutex
	top map[string]bool // topics whose queues to delete at cleanup
}

// setup returns a config with a fresh prefix and deletes everything under
// that prefix when the test ends.
func setup(t *testing.T) *bundle {
	t.Helper()
	url := testenv.AMQP(t)
	prefix := testenv.Name("dbtest")
	b := &bundle{tb: t, top: map[string]bool{}, cfg: Config{
		URL: url, Prefix: prefix, Unit: testUnit, Depth: testDepth, Lead: testLead,
		ConnectionName: prefix, ReconnectMax: time.Second,
	}}
	t.Cleanup(b.deleteTopology)
	return b
}

func (b *bundle) topic(topic string) {
	b.mu.Lock()
	b.top[topic] = true
	b.mu.Unlock()
}

// clients returns a new Publisher and Subscriber on the bundle's prefix,
// closed at cleanup.
func (b *bundle) clients(t *testing.T, topic string) (*Publisher, *Subscriber) {
	t.Helper()
	b.topic(topic)
	pub, err := NewPublisher(context.Background(), b.cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	sub, err := NewSubscriber(b.cfg)
	if err != nil {
		t.Fatalf("NewSubscriber: %v", err)
	}
	t.Cleanup(func() { _ = sub.Close(); _ = pub.Close() })
	return pub, sub
}

// channel returns a raw channel for the test's own declarations and checks.
func (b *bundle) channel(t *testing.T) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(b.cfg.URL)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	return ch
}

// publishRaw puts a message with exactly these headers and body on topic's
// queue through the default exchange, as a foreign producer would, and
// returns the broker's refusal if any.
func (b *bundle) publishRaw(t *testing.T, topic string, headers amqp.Table, body []byte) error {
	t.Helper()
	b.topic(topic)
	ch := b.channel(t)
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm: %w", err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", topology{cfg: b.cfg}.topicQueue(topic), true, false, amqp.Publishing{Headers: headers, Body: body, DeliveryMode: amqp.Persistent})
	if err != nil {
		return fmt.Errorf("publish raw: %w", err)
	}
	if !dc.Wait() {
		return errors.New("publish raw: nacked")
	}
	return nil
}

// deleteTopology removes every queue and exchange of the bundle's prefix.
func (b *bundle) deleteTopology() {
	conn, err := amqp.Dial(b.cfg.URL)
	if err != nil {
		b.tb.Logf("cleanup: dial: %v", err)
		return
	}
	defer conn.Close()
	cfg, err := b.cfg.withDefaults()
	if err != nil {
		return
	}
	topo := topology{cfg: cfg}
	var queues, exchanges []string
	b.mu.Lock()
	for tp := range b.top {
		queues = append(queues, topo.topicQueue(tp))
	}
	b.mu.Unlock()
	queues = append(queues, topo.parkingQueue())
	exchanges = append(exchanges, topo.deliveryExchange(), topo.parkingExchange(), topo.delayedExchange())
	for k := 0; k < cfg.Depth; k++ {
		queues = append(queues, topo.levelQueue(k))
		exchanges = append(exchanges, topo.levelExchange(k))
	}
	for _, q := range queues {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(q, false, false, false)
		_ = ch.Close()
	}
	for _, x := range exchanges {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_ = ch.ExchangeDelete(x, false, false)
		_ = ch.Close()
	}
}
