package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DelayedPlugin checks that the RabbitMQ at AMQP(t) has the
// rabbitmq_delayed_message_exchange plugin enabled and returns its URL.
// Without the plugin it fails the test under CI=true and skips it
// elsewhere, saying how to get the plugin: only the tests of
// delayed-exchange mode need it, and scripts/services.sh up installs it when
// it finds the .ez file.
func DelayedPlugin(t testing.TB) string {
	t.Helper()
	raw := AMQP(t)
	conn, err := amqp.DialConfig(raw, amqp.Config{Dial: amqp.DefaultDial(reachTimeout)})
	if err != nil {
		Unreachable(t, "RabbitMQ", "DELAYBRIDGE_AMQP_URL", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("RabbitMQ: open channel: %v", err)
	}
	x := fmt.Sprintf("dbtest.plugin-check.%d", time.Now().UnixNano())
	err = ch.ExchangeDeclare(x, "x-delayed-message", false, true, false, false, amqp.Table{"x-delayed-type": "direct"})
	if err == nil {
		_ = ch.ExchangeDelete(x, false, false)
		return raw
	}
	if !strings.Contains(err.Error(), "unknown exchange type") {
		t.Fatalf("RabbitMQ: declare an x-delayed-message exchange: %v", err)
	}
	msg := "RabbitMQ has no rabbitmq_delayed_message_exchange plugin, which delayed-exchange mode needs: put the plugin's .ez " +
		"(https://github.com/rabbitmq/rabbitmq-delayed-message-exchange/releases, the release for your RabbitMQ's minor version) " +
		"in ../shared/rabbitmq-plugins beside the repository or in $DELAYBRIDGE_RABBITMQ_PLUGINS_DIR, then run scripts/services.sh up"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}
