package rabbit

import (
	"context"
	"net/url"
	"regexp"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// receive waits for n deliveries of topic and acks them.
func receive(t *testing.T, sub *Subscriber, topic string, n int) []*broker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	var got []*broker.Message
	for len(got) < n {
		select {
		case d := <-ch:
			if d.Err != nil {
				t.Fatalf("delivery: %v", d.Err)
			}
			got = append(got, d.Message)
			_ = d.Acker.Ack()
		case <-ctx.Done():
			t.Fatalf("%d of %d messages arrived within 30s", len(got), n)
		}
	}
	return got
}

// A queue of the vhost that happens to be named like a topic receives no
// copy of that topic's delayed messages.
func TestLadder_AQueueNamedLikeTheTopicGetsNoCopies(t *testing.T) {
	b := setup(t)
	topic := testenv.Name("orders")
	ch := b.channel(t)
	if _, err := ch.QueueDeclare(topic, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	pub, sub := b.clients(t, topic)
	if err := pub.Publish(context.Background(),
		&broker.Message{Topic: topic, Key: "later", DeliverAt: time.Now().Add(3 * testUnit)},
		&broker.Message{Topic: topic, Key: "now", DeliverAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	receive(t, sub, topic, 2)
	q, err := ch.QueueDeclarePassive(topic, false, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 0 {
		t.Fatalf("the unrelated queue %q received %d copies", topic, q.Messages)
	}
}

// A user whose permissions cover only the prefix (configure, write and
// read on ^<prefix>\.) runs the whole ladder: nothing is published through
// amq.default, which reaches every queue of the vhost.
func TestLadder_NeedsNoPermissionOutsideItsPrefix(t *testing.T) {
	b := setup(t)
	user := testenv.Name("ladder_user")
	const password = "ladder-test-only"
	testenv.Rabbitmqctl(t, "add_user", user, password)
	t.Cleanup(func() { testenv.Rabbitmqctl(t, "delete_user", user) })
	perm := "^" + regexp.QuoteMeta(b.cfg.Prefix) + `\.`
	testenv.Rabbitmqctl(t, "set_permissions", "-p", "/", user, perm, perm, perm)
	u, err := url.Parse(b.cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, password)
	admin := b.cfg.URL
	b.cfg.URL = u.String()
	t.Cleanup(func() { b.cfg.URL = admin }) // the topology's cleanup runs as admin
	topic := "perm"
	pub, sub := b.clients(t, topic)
	if err := pub.Publish(context.Background(),
		&broker.Message{Topic: topic, Key: "later", DeliverAt: time.Now().Add(3 * testUnit)},
		&broker.Message{Topic: topic, Key: "now", DeliverAt: time.Now()}); err != nil {
		t.Fatalf("publish with prefix-only permissions: %v", err)
	}
	receive(t, sub, topic, 2)
	// The same user may not write to the default exchange: the test would
	// prove nothing if it could.
	conn, err := amqp.Dial(b.cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	_ = raw.Publish("", topology{cfg: b.cfg}.topicQueue(topic), false, false, amqp.Publishing{Body: []byte("x")})
	if _, err := raw.QueueDeclarePassive(topology{cfg: b.cfg}.topicQueue(topic), true, false, false, false, nil); err == nil {
		t.Fatal("a write to amq.default was allowed; the permissions under test are too wide")
	}
}
