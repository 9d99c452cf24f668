package rabbit

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// The ladder.
//
// Level k (0 ≤ k < Depth) is a quorum queue <prefix>.delay.<k> whose one
// queue-wide TTL is Unit × 2^k, so within a level expiry order is arrival
// order and nothing blocks behind a longer delay. A delay of n units, with
// highest set bit top, is published to the direct entry exchange
// <prefix>.entry with the routing key <prefix>.delay.<top>, which is bound
// to that queue alone, carrying a header dlbl-<k> = "1" for each other set
// bit k of n, and the topic as a second routing key in the CC header. The
// entry exchange has no binding a topic can match (binding keys contain
// '.', topics cannot), so the CC key goes nowhere until the message reaches
// the delivery exchange; through the default exchange it would copy the
// message into any queue of the vhost named like the topic, and every
// publisher would need write access to amq.default. A message due in less
// than one unit goes to the delivery exchange at once. So publishers need
// no permission outside the prefix. Each queue dead-letters (at-least-once
// unless Config.DeadLettering says otherwise, keeping the message's routing keys) to the next level's headers exchange <prefix>.ladder.<k−1>,
// which routes a message with dlbl-<k−1>=1 to its queue; any other message
// it cannot route, so its alternate exchange, the exchange below it, takes
// it (headers exchanges cannot match an absent header, and a header per
// zero bit cost a measurable share of the publish rate). Below level 0 is
// the direct
// delivery exchange <prefix>.deliver, which routes the topic key to the
// topic's consumer queue <prefix>.q.<topic> (the queue-name key matches no
// topic: names contain '.', topics cannot). What it cannot route goes
// through its alternate exchange to the parking queue <prefix>.parked, so
// an unroutable message never stalls the level queue that dead-lettered it.
// A message spends exactly Unit × n in level queues.
//
// Why headers and not a routing key spelling the bits matched by "*.*.1.#"
// topic patterns: matching a key of Depth words costs RabbitMQ a trie walk
// per exchange, on the publishing channel and in each queue's single
// dead-letter worker. Under load it cut the confirmed publish rate sharply
// and left a chain of hops behind; a headers exchange with one binding
// compares a few headers.

// topology names and declares the exchanges and queues of one prefix.
type topology struct {
	cfg Config
}

func (t topology) levelExchange(k int) string { return fmt.Sprintf("%s.ladder.%d", t.cfg.Prefix, k) }
func (t topology) levelQueue(k int) string    { return fmt.Sprintf("%s.delay.%d", t.cfg.Prefix, k) }
func (t topology) deliveryExchange() string   { return t.cfg.Prefix + ".deliver" }
func (t topology) entryExchange() string      { return t.cfg.Prefix + ".entry" }
func (t topology) parkingExchange() string    { return t.cfg.Prefix + ".parking" }
func (t topology) parkingQueue() string       { return t.cfg.Prefix + ".parked" }
func (t topology) delayedExchange() string    { return t.cfg.Prefix + ".delayed" }
func (t topology) topicQueue(topic string) string {
	return t.cfg.Prefix + ".q." + topic
}

// nextExchange is where level k sends what leaves it, and the alternate
// exchange of level k's exchange, which takes a message whose bit k is 0.
func (t topology) nextExchange(k int) string {
	if k == 0 {
		return t.deliveryExchange()
	}
	return t.levelExchange(k - 1)
}

// bitHeaders are the names bitHeader returns, made once: every ladder
// publish sets several.
var bitHeaders = func() (names [64]string) {
	for k := range names {
		names[k] = "dlbl-" + strconv.Itoa(k)
	}
	return names
}()

// bitHeader names the header that marks a message's set bit for level k.
func bitHeader(k int) string { return bitHeaders[k] }

// bitArgs are the arguments of the headers binding of level k's queue.
func bitArgs(k int) amqp.Table {
	return amqp.Table{"x-match": "all", bitHeader(k): "1"}
}

// units takes the lead off d and rounds it down to whole units, capped at
// the ladder's top.
func (t topology) units(d time.Duration) uint64 {
	d -= max(t.cfg.Lead, 0)
	if d <= 0 {
		return 0
	}
	n := uint64(d / t.cfg.Unit)
	if top := uint64(1)<<t.cfg.Depth - 1; n > top {
		n = top
	}
	return n
}

// ladderRoute says how to publish a message of topic delayed by d: to
// exchange with key. When n, the delay in units, is not zero, that is the
// entry exchange with the entry level's queue name as the key, and the
// message needs setBits and the topic as a CC routing key; for less than
// one unit it is the delivery exchange with the topic as the key.
func (t topology) ladderRoute(d time.Duration, topic string) (exchange, key string, n uint64) {
	n = t.units(d)
	if n == 0 {
		return t.deliveryExchange(), topic, 0
	}
	return t.entryExchange(), t.levelQueue(bits.Len64(n) - 1), n
}

// setBits marks each set bit of n below its entry level, which is reached
// by queue name and needs no mark.
func setBits(h amqp.Table, n uint64) {
	for k := 0; k < bits.Len64(n)-1; k++ {
		if n>>k&1 == 1 {
			h[bitHeader(k)] = "1"
		}
	}
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
		"x-dead-letter-strategy": t.cfg.DeadLettering.String(),
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
	entry := t.entryExchange()
	if err := ch.ExchangeDeclare(entry, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("rabbit: declare exchange %s: %w", entry, err)
	}
	for k := 0; k < t.cfg.Depth; k++ {
		x, q := t.levelExchange(k), t.levelQueue(k)
		if err := ch.ExchangeDeclare(x, amqp.ExchangeHeaders, true, false, false, false, amqp.Table{"alternate-exchange": t.nextExchange(k)}); err != nil {
			return fmt.Errorf("rabbit: declare exchange %s: %w", x, err)
		}
		if _, err := ch.QueueDeclare(q, true, false, false, false, t.levelArgs(k)); err != nil {
			return fmt.Errorf("rabbit: declare ladder queue %s (an existing queue with other arguments needs deleting first): %w", q, err)
		}
		if err := ch.QueueBind(q, "", x, false, bitArgs(k)); err != nil {
			return fmt.Errorf("rabbit: bind %s to %s: %w", q, x, err)
		}
		if err := ch.QueueBind(q, q, entry, false, nil); err != nil {
			return fmt.Errorf("rabbit: bind %s to %s: %w", q, entry, err)
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
	if err := ch.ExchangeDeclare(dx, amqp.ExchangeDirect, true, false, false, false, amqp.Table{"alternate-exchange": px}); err != nil {
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

// declareTopic declares topic's consumer queue on ch and binds it to where
// due messages come out. It returns the channel to go on with: conn's new
// one when the dead queue's declaration closed ch.
func (t topology) declareTopic(conn *amqp.Connection, ch *amqp.Channel, topic string) (*amqp.Channel, error) {
	q := t.topicQueue(topic)
	_, err := ch.QueueDeclare(q, true, false, false, false, t.topicArgs(topic))
	var aerr *amqp.Error
	if err != nil && topic == broker.DefaultDeadTopic && errors.As(err, &aerr) && aerr.Code == amqp.PreconditionFailed {
		// Declared by an earlier version, unbounded: keep using it, as
		// failing every dead-letter publish would be worse.
		t.cfg.Logger.Warn("rabbit: the dead queue has other arguments than this version declares, so it is not bounded; delete it once (it holds only copies of what the database records) to have it declared bounded",
			"queue", q, "err", err)
		if ch, err = conn.Channel(); err != nil {
			return nil, fmt.Errorf("rabbit: open channel: %w", err)
		}
		_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
	}
	if err != nil {
		return ch, fmt.Errorf("rabbit: declare queue %s: %w", q, err)
	}
	x, key := t.deliveryExchange(), topic
	if t.cfg.Mode == ModeDelayedExchange {
		x, key = t.delayedExchange(), topic
	}
	if err := ch.QueueBind(q, key, x, false, nil); err != nil {
		return ch, fmt.Errorf("rabbit: bind %s to %s: %w", q, x, err)
	}
	return ch, nil
}

// The dead queue's bound. It holds copies of what the consumers gave up on
// (broker.PublishDead); the database records every task among them, so at
// the bound the oldest copies are dropped, not the new ones refused. 4 MiB
// bodies made one fill a node's memory.
const (
	deadMaxLength = 10_000
	deadMaxBytes  = 64 << 20
)

// topicArgs returns the arguments of topic's queue.
func (t topology) topicArgs(topic string) amqp.Table {
	if topic == broker.DefaultDeadTopic {
		return quorum(amqp.Table{"x-max-length": int64(deadMaxLength), "x-max-length-bytes": int64(deadMaxBytes), "x-overflow": "drop-head"})
	}
	// A topic's queue is bounded like a ladder level: a consumer that is
	// down must not let one topic fill the broker's memory. At the bound a
	// publish is nacked (the relay retries it later) and the last level
	// keeps its due messages until there is room.
	if t.cfg.MaxLength > 0 {
		return quorum(amqp.Table{"x-max-length": int64(t.cfg.MaxLength), "x-overflow": "reject-publish"})
	}
	return quorum(nil)
}
