package rabbit

import (
	"context"
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
// The plugin (3.10.x, checked on the test broker) delivers at once a message
// whose x-delay is above 2^32 − 1 ms, so the cap in delayedRoute is what
// keeps a long delay from arriving early: such a delay hops instead.

// pluginRetired is what a process in delayed-exchange mode logs when it
// starts.
const pluginRetired = "rabbit: delayed-exchange mode is deprecated: the rabbitmq_delayed_message_exchange plugin was archived upstream in January 2026, keeps its messages in Mnesia on one node, and cannot run on RabbitMQ 4.3 or later; move to the ladder (--rabbit-mode ladder), as docs/brokers.md says, without losing a task"

// ErrPluginMissing reports a broker without the x-delayed-message exchange
// type. Use ModeLadder, which needs no plugin.
var ErrPluginMissing = errors.New("rabbit: the broker has no x-delayed-message exchange type (rabbitmq_delayed_message_exchange plugin not enabled); use the default ladder mode (Mode: ModeLadder), which needs no plugin")

// declareDelayed declares the delayed-message exchange. A broker without the
// plugin answers 503 COMMAND_INVALID "unknown exchange type" and closes the
// channel; that becomes ErrPluginMissing.
func (t topology) declareDelayed(ch *amqp.Channel) error {
	x := t.delayedExchange()
	err := ch.ExchangeDeclare(x, t.cfg.delayedKind(), true, false, false, false, amqp.Table{"x-delayed-type": amqp.ExchangeDirect})
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
	if hop := t.cfg.delayedHop(); d > hop {
		d = hop
	}
	if d < 0 {
		d = 0
	}
	return t.delayedExchange(), topic, int64(d / time.Millisecond)
}

// delayedExchangeType is the exchange type the plugin adds.
const delayedExchangeType = "x-delayed-message"

// delayedHop is the longest x-delay this configuration sends.
func (c Config) delayedHop() time.Duration {
	if c.delayedMaxHop > 0 && c.delayedMaxHop < MaxDelayedExchangeHop {
		return c.delayedMaxHop
	}
	return MaxDelayedExchangeHop
}

// delayedKind is the exchange type delayed-exchange mode declares.
func (c Config) delayedKind() string {
	if c.delayedType != "" {
		return c.delayedType
	}
	return delayedExchangeType
}

// PluginPresent reports whether the broker at cfg.URL has the
// x-delayed-message exchange type, by declaring a throwaway auto-delete
// exchange of that type under cfg.Prefix and deleting it again. An error
// means the broker could not be asked, not that the plugin is missing.
func PluginPresent(ctx context.Context, cfg Config) (bool, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return false, err
	}
	conn, err := dial(ctx, cfg, "plugin check")
	if err != nil {
		return false, err
	}
	defer closeQuietly(conn)
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("rabbit: open channel: %w", err)
	}
	x := fmt.Sprintf("%s.plugin-check.%d", cfg.Prefix, time.Now().UnixNano())
	err = ch.ExchangeDeclare(x, cfg.delayedKind(), false, true, false, false, amqp.Table{"x-delayed-type": amqp.ExchangeDirect})
	switch {
	case err == nil:
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			return true, fmt.Errorf("rabbit: delete the plugin check's exchange %s: %w", x, err)
		}
		return true, nil
	case isUnknownExchangeType(err):
		return false, nil
	}
	return false, fmt.Errorf("rabbit: declare exchange %s: %w", x, err)
}
