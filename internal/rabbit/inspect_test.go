package rabbit_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestPurgeTopic_EmptiesOnlyTheTopicQueue(t *testing.T) {
	testenv.SkipIfShort(t, "needs RabbitMQ")
	url := testenv.AMQP(t)
	prefix := testenv.Name("purge")
	const depth = 4
	cfg := rabbit.Config{URL: url, Prefix: prefix, Unit: 250 * time.Millisecond, Depth: depth, Lead: 200 * time.Millisecond,
		ConnectionName: prefix, ReconnectMax: time.Second}
	t.Cleanup(func() { testenv.DeleteRabbitPrefix(t, url, prefix) })
	ctx := context.Background()
	pub, err := rabbit.NewPublisher(ctx, cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	const topic = "purge"
	now := broker.MillisUTC(time.Now())
	msgs := []*broker.Message{
		{Topic: topic, Key: "a", DeliverAt: now},
		{Topic: topic, Key: "b", DeliverAt: now},
		{Topic: topic, Key: "c", DeliverAt: now},
		{Topic: topic, Key: "later", DeliverAt: now.Add(time.Hour)},
	}
	if err := pub.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	if _, err := rabbit.PurgeTopic(ctx, cfg, "no spaces"); !errors.Is(err, broker.ErrInvalidTopic) {
		t.Fatalf("PurgeTopic(bad name) = %v, want ErrInvalidTopic", err)
	}
	n, err := rabbit.PurgeTopic(ctx, cfg, topic)
	if err != nil || n != 3 {
		t.Fatalf("PurgeTopic = %d, %v; want the 3 due messages", n, err)
	}

	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if q, err := ch.QueueDeclarePassive(prefix+".q."+topic, true, false, false, false, nil); err != nil || q.Messages != 0 {
		t.Fatalf("topic queue after purge: %+v, %v", q, err)
	}
	onLadder := 0
	for k := range depth {
		q, err := ch.QueueDeclarePassive(fmt.Sprintf("%s.delay.%d", prefix, k), true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		onLadder += q.Messages
	}
	if onLadder != 1 {
		t.Fatalf("%d messages on the ladder after the purge, want the 1 due later", onLadder)
	}
}

// Inspect sees no ladder under a new prefix, the whole ladder once a
// publisher declared it, and a level too many when asked with a shallower
// depth than the ladder was declared with.
func TestInspect_FindsTheLadderAsDeclared(t *testing.T) {
	testenv.SkipIfShort(t, "needs RabbitMQ")
	url := testenv.AMQP(t)
	prefix := testenv.Name("inspect")
	const depth = 4
	cfg := rabbit.Config{URL: url, Prefix: prefix, Unit: 250 * time.Millisecond, Depth: depth, ConnectionName: prefix, ReconnectMax: time.Second}
	t.Cleanup(func() { testenv.DeleteRabbitPrefix(t, url, prefix) })
	ctx := context.Background()
	in, err := rabbit.Inspect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if in.Version == "" || in.QuorumDeadLettering != nil || in.Depth != depth || in.LevelsMissing != depth || in.ExtraLevel {
		t.Fatalf("before any publisher: %+v, want a version, quorum dead-lettering, all %d levels missing", in, depth)
	}
	pub, err := rabbit.NewPublisher(ctx, cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	if in, err = rabbit.Inspect(ctx, cfg); err != nil || in.LevelsMissing != 0 || in.ExtraLevel {
		t.Fatalf("after the publisher declared the ladder: %+v, %v; want every level and no extra", in, err)
	}
	shallow := cfg
	shallow.Depth = depth - 1
	if in, err = rabbit.Inspect(ctx, shallow); err != nil || in.LevelsMissing != 0 || !in.ExtraLevel {
		t.Fatalf("depth %d against a ladder of %d: %+v, %v; want an extra level", depth-1, depth, in, err)
	}
	delayed := cfg
	delayed.Mode = rabbit.ModeDelayedExchange
	if in, err = rabbit.Inspect(ctx, delayed); err != nil || in.Depth != 0 || in.LevelsMissing != 0 {
		t.Fatalf("delayed-exchange mode: %+v, %v; want no ladder checked", in, err)
	}
	bad := cfg
	bad.URL = "amqp://127.0.0.1:1/"
	if _, err := rabbit.Inspect(ctx, bad); err == nil {
		t.Fatal("Inspect of a port nothing listens on returned no error")
	}
}
