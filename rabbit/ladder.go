package rabbit

import (
	"fmt"
	"math/bits"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The ladder.
//
// Level k (0 ≤ k < Depth) is a quorum queue <prefix>.delay.<k> whose one
// queue-wide TTL is Unit × 2^k, so within a level expiry order is arrival
// order and nothing blocks behind a longer delay. A delay of n units travels
// with the routing key "~.b(Depth−1). … .b1.b0.<topic>", n's bits most
// significant first. Each level has a topic exchange <prefix>.ladder.<k>
// that routes a key with a 1 in its position to its queue and a 0 to the
// next level's exchange; the queue dead-letters (at-least-once, keeping the
// message's routing keys) to that same next exchange. Below level 0 is the
// delivery exchange <prefix>.deliver, which routes "~.#.<topic>" to the
// topic's consumer queue <prefix>.q.<topic>; what it cannot route goes
// through its alternate exchange to the parking queue <prefix>.parked, so an
// unroutable message never stalls the level queue that dead-lettered it.
//
// Matching a long key against "*.*.1.#" patterns costs the publishing
// channel more than the quorum queue write (measured: it halved the
// confirmed publish rate), so a publish skips it: it goes through the
// default exchange straight to the queue of n's highest set bit, carrying
// the bits key in the CC header. RabbitMQ dead-letters with every routing
// key the message was published with, CC included, so from then on the
// bits key steers it; the queue-name key matches no pattern, because every
// pattern starts with "~", which no name may contain. A message spends
// exactly Unit × n in level queues.

// topology names and declares the exchanges and queues of one prefix.
type topology struct {
	cfg Config
}

func (t topology) levelExchange(k int) string { return fmt.Sprintf("%s.ladder.%d", t.cfg.Prefix, k) }
func (t topology) levelQueue(k int) string    { return fmt.Sprintf("%s.delay.%d", t.cfg.Prefix, k) }
func (t topology) deliveryExchange() string   { return t.cfg.Prefix + ".deliver" }
func (t topology) parkingExchange() string    { return t.cfg.Prefix + ".parking" }
func (t topology) parkingQueue() string       { return t.cfg.Prefix + ".parked" }
func (t topology) delayedExchange() string    { return t.cfg.Prefix + ".delayed" }
func (t topology) topicQueue(topic string) string {
	return t.cfg.Prefix + ".q." + topic
}

// nextExchange is where level k sends what leaves it.
func (t topology) nextExchange(k int) string {
	if k == 0 {
		return t.deliveryExchange()
	}
	return t.levelExchange(k - 1)
}

// bitPattern matches routing keys whose word for level k is bit.
func (t topology) bitPattern(k int, bit string) string {
	return "~." + strings.Repeat("*.", t.cfg.Depth-1-k) + bit + ".#"
}

// units rounds d down to whole units, capped at the ladder's top.
func (t topology) units(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	n := uint64(d / t.cfg.Unit)
	if top := uint64(1)<<t.cfg.Depth - 1; n > top {
		n = top
	}
	return n
}

// routingKey spells n in Depth bits, most significant first, then the topic.
func (t topology) routingKey(n uint64, topic string) string {
	var b strings.Builder
	b.Grow(2 + 2*t.cfg.Depth + len(topic))
	b.WriteString("~.")
	for k := t.cfg.Depth - 1; k >= 0; k-- {
		if n>>k&1 == 1 {
			b.WriteString("1.")
		} else {
			b.WriteString("0.")
		}
	}
	b.WriteString(topic)
	return b.String()
}

// ladderRoute returns how to publish a message of topic delayed by d: to
// the queue of the highest set bit of d in units through the default
// exchange, with the bits key to put in the CC header; or, for less than one
// unit, straight to the topic's queue with no CC.
func (t topology) ladderRoute(d time.Duration, topic string) (queue, cc string) {
	n := t.units(d)
	if n == 0 {
		return t.topicQueue(topic), ""
	}
	return t.levelQueue(bits.Len64(n) - 1), t.routingKey(n, topic)
}

// quorum returns the arguments of a quorum queue plus extra.
func quorum(extra amqp.Table) amqp.Table {
	args := amqp.Table{"x-queue-type": "quorum"}
	for k, v := range extra {
		args[k] = v
	}
	return args
}

// levelArgs returns the arguments of level k's queue.
func (t topology) levelArgs(k int) amqp.Table {
	args := quorum(amqp.Table{
		"x-message-ttl":          int64((t.cfg.Unit << k) / time.Millisecond),
		"x-dead-letter-exchange": t.nextExchange(k),
		"x-dead-letter-strategy": "at-least-once",
		"x-overflow":             "reject-publish",
	})
	if t.cfg.MaxLength > 0 {
		args["x-max-length"] = int64(t.cfg.MaxLength)
	}
	return args
}

// declareLadder declares the delivery side and every level, idempotently.
// Declaring from the bottom up means every exchange exists before anything
// routes into it.
func (t topology) declareLadder(ch *amqp.Channel) error {
	if err := t.declareDelivery(ch); err != nil {
		return err
	}
	for k := 0; k < t.cfg.Depth; k++ {
		x, q := t.levelExchange(k), t.levelQueue(k)
		if err := ch.ExchangeDeclare(x, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("rabbit: declare exchange %s: %w", x, err)
		}
		if _, err := ch.QueueDeclare(q, true, false, false, false, t.levelArgs(k)); err != nil {
			return fmt.Errorf("rabbit: declare ladder queue %s (an existing queue with other arguments needs deleting first): %w", q, err)
		}
		if err := ch.QueueBind(q, t.bitPattern(k, "1"), x, false, nil); err != nil {
			return fmt.Errorf("rabbit: bind %s to %s: %w", q, x, err)
		}
		if err := ch.ExchangeBind(t.nextExchange(k), t.bitPattern(k, "0"), x, false, nil); err != nil {
			return fmt.Errorf("rabbit: bind %s to %s: %w", t.nextExchange(k), x, err)
		}
	}
	return nil
}

// declareDelivery declares the delivery exchange and its parking lot.
func (t topology) declareDelivery(ch *amqp.Channel) error {
	px, pq := t.parkingExchange(), t.parkingQueue()
	if err := ch.ExchangeDeclare(px, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("rabbit: declare exchange %s: %w", px, err)
	}
	if _, err := ch.QueueDeclare(pq, true, false, false, false, quorum(nil)); err != nil {
		return fmt.Errorf("rabbit: declare parking queue %s: %w", pq, err)
	}
	if err := ch.QueueBind(pq, "", px, false, nil); err != nil {
		return fmt.Errorf("rabbit: bind %s to %s: %w", pq, px, err)
	}
	dx := t.deliveryExchange()
	if err := ch.ExchangeDeclare(dx, amqp.ExchangeTopic, true, false, false, false, amqp.Table{"alternate-exchange": px}); err != nil {
		return fmt.Errorf("rabbit: declare exchange %s: %w", dx, err)
	}
	return nil
}

// declare declares the mode's shared topology.
func (t topology) declare(ch *amqp.Channel) error {
	if t.cfg.Mode == ModeDelayedExchange {
		return t.declareDelayed(ch)
	}
	return t.declareLadder(ch)
}

// declareTopic declares topic's consumer queue and binds it to where due
// messages come out.
func (t topology) declareTopic(ch *amqp.Channel, topic string) error {
	q := t.topicQueue(topic)
	if _, err := ch.QueueDeclare(q, true, false, false, false, quorum(nil)); err != nil {
		return fmt.Errorf("rabbit: declare queue %s: %w", q, err)
	}
	x, key := t.deliveryExchange(), "~.#."+topic
	if t.cfg.Mode == ModeDelayedExchange {
		x, key = t.delayedExchange(), topic
	}
	if err := ch.QueueBind(q, key, x, false, nil); err != nil {
		return fmt.Errorf("rabbit: bind %s to %s: %w", q, x, err)
	}
	return nil
}
