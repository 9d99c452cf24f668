package rabbit

import (
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Delayed-exchange mode.
//
// The exchange <prefix>.delayed has type x-delayed-message routing like a
// direct exchange; a message carries its delay in the x-delay header, at
// most MaxDelayedExchangeHop, and longer delays hop. Topic queues bind to it
// with the topic as the key. The plugin holds delayed messages in a Mnesia
// table on one node, unreplicated, and routes them only when due, so a
// mandatory publish would always come back: this mode publishes without the
// mandatory flag.
//
// Only the detection of a missing plugin is tested against a real broker
// here; the test broker has no plugin, so the mode itself is untested.

// ErrPluginMissing reports a broker without the x-delayed-message exchange
// type. Use ModeLadder, which needs no plugin.
var ErrPluginMissing = errors.New("rabbit: the broker has no x-delayed-message exchange type (rabbitmq_delayed_message_exchange plugin not enabled); use the default ladder mode (Mode: ModeLadder), which needs no plugin")

// declareDelayed declares the delayed-message exchange. A broker without the
// plugin answers 503 COMMAND_INVALID "unknown exchange type" and closes the
// channel; that becomes ErrPluginMissing.
func (t topology) declareDelayed(ch *amqp.Channel) error {
	x := t.delayedExchange()
	err := ch.ExchangeDeclare(x, "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": amqp.ExchangeDirect})
	if err == nil {
		return nil
	}
	if isUnknownExchangeType(err) {
		return fmt.Errorf("%w: declare exchange %s: %w", ErrPluginMissing, x, err)
	}
	return fmt.Errorf("rabbit: declare exchange %s: %w", x, err)
}

func isUnknownExchangeType(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.CommandInvalid && strings.Contains(ae.Reason, "unknown exchange type")
}

// delayedRoute returns where to publish a message of topic delayed by d and
// the x-delay value, 0 for none.
func (t topology) delayedRoute(d time.Duration, topic string) (exchange, key string, delayMS int64) {
	if d > MaxDelayedExchangeHop {
		d = MaxDelayedExchangeHop
	}
	if d < 0 {
		d = 0
	}
	return t.delayedExchange(), topic, int64(d / time.Millisecond)
}
