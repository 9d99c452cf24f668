package outbox_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// inputsRabbit is a publisher on the real RabbitMQ under a prefix of its
// own, and a way to ask whether a topic's queue was declared.
type inputsRabbit struct {
	pub    *rabbit.Publisher
	url    string
	prefix string
}

func newInputsRabbit(t *testing.T) *inputsRabbit {
	t.Helper()
	url := testenv.AMQP(t)
	prefix := testenv.Name("obin")
	t.Cleanup(func() { testenv.DeleteRabbitPrefix(t, url, prefix) })
	pub, err := rabbit.NewPublisher(context.Background(), rabbit.Config{URL: url, Prefix: prefix, Unit: 250 * time.Millisecond, Depth: 4, ConnectionName: prefix, Logger: quiet()})
	if err != nil {
		t.Fatalf("rabbit.NewPublisher: %v", err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return &inputsRabbit{pub: pub, url: url, prefix: prefix}
}

// declared reports whether topic's queue exists on the broker.
func (r *inputsRabbit) declared(t *testing.T, topic string) bool {
	t.Helper()
	conn, err := amqp.Dial(r.url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	_, err = ch.QueueDeclarePassive(r.prefix+".q."+topic, true, false, false, false, nil)
	if err == nil {
		_ = ch.Close()
		return true
	}
	if e, ok := err.(*amqp.Error); !ok || e.Code != amqp.NotFound {
		t.Fatalf("passive declare of %s: %v", topic, err)
	}
	return false
}

// insertPayload writes a row with plain SQL, as a producer in another
// language would, bypassing Schedule's payload limit.
func (b *bundle) insertPayload(t *testing.T, topic, key string, payload []byte, due time.Time, state string) {
	t.Helper()
	now := time.Now().UnixMilli()
	published := int64(0)
	if state == "published" {
		published = due.UnixMilli()
	}
	if _, err := b.db.ExecContext(b.ctx, `INSERT INTO delay_task
  (topic, task_key, due_ms, payload, state, published_ms, created_ms, updated_ms)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, topic, key, due.UnixMilli(), payload, state, published, now, now); err != nil {
		t.Fatalf("insert %s/%s: %v", topic, key, err)
	}
}

// lastError returns the row's state and last_error.
func (b *bundle) lastError(t *testing.T, topic, key string) (state, lastErr string) {
	t.Helper()
	if err := b.db.QueryRowContext(b.ctx, "SELECT TRIM(state), COALESCE(last_error, '') FROM delay_task WHERE topic = ? AND task_key = ?", topic, key).Scan(&state, &lastErr); err != nil {
		t.Fatalf("read %s/%s: %v", topic, key, err)
	}
	return state, lastErr
}

// A row whose payload is larger than any consumer accepts (written by a
// foreign producer; Schedule refuses far less) is dead with its reason
// before it reaches the broker: no copy is published, no queue declared,
// and the valid row beside it goes out. Published, every consumer would
// refuse it as malformed without marking it, and the scanner would
// re-publish it for ever.
func TestRelay_APayloadNoConsumerAcceptsGoesDeadUnpublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rmq := newInputsRabbit(t)
	pub := &keysPublisher{Publisher: rmq.pub}
	due := time.Now().Add(-time.Second)
	b.insertPayload(t, "huge", "too-big", bytes.Repeat([]byte{'x'}, broker.MaxBody+1), due, "pending")
	b.insertPayload(t, "fine", "small", []byte("ok"), due, "pending")
	if n, err := newRelay(t, b, pub, outbox.RelayConfig{}).Once(b.ctx); err != nil || n != 2 {
		t.Fatalf("Once = %d, %v; want 2 rows claimed", n, err)
	}
	if got := pub.sent(); len(got) != 1 || got[0] != "small" {
		t.Fatalf("handed to the broker: %q; want only the small row", got)
	}
	state, lastErr := b.lastError(t, "huge", "too-big")
	if state != "dead" || !strings.HasPrefix(lastErr, "invalid row: payload of 4194305 bytes") {
		t.Fatalf("the oversize row is %s with %q; want dead, invalid row: payload of 4194305 bytes …", state, lastErr)
	}
	if rmq.declared(t, "huge") {
		t.Fatal("a queue was declared for the oversize row's topic")
	}
	if state, _ := b.lastError(t, "fine", "small"); state != "published" || !rmq.declared(t, "fine") {
		t.Fatalf("the small row is %s; want published into its declared queue", state)
	}
}

// A row published with such a payload before the relay refused it (or by
// another program) is overdue for ever: the scanner's re-publish is refused
// by the RabbitMQ publisher, so the row goes dead instead of being copied
// into the broker at every rescue.
func TestScanner_ARescueOfAPayloadNoConsumerAcceptsGoesDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rmq := newInputsRabbit(t)
	b.insertPayload(t, "huge", "left-over", bytes.Repeat([]byte{'y'}, broker.MaxBody+1), time.Now().Add(-time.Minute), "published")
	s, err := scanner.New(b.db, rmq.pub, scanner.Config{Grace: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.Rescue(b.ctx); err != nil || n != 1 {
		t.Fatalf("Rescue = %d, %v; want the overdue row claimed", n, err)
	}
	state, lastErr := b.lastError(t, "huge", "left-over")
	if state != "dead" || !strings.Contains(lastErr, "payload of 4194305 bytes") {
		t.Fatalf("the rescued oversize row is %s with %q; want dead with the payload's size as the reason", state, lastErr)
	}
	if rmq.declared(t, "huge") {
		t.Fatal("the rescue declared a queue for the oversize row's topic")
	}
}
