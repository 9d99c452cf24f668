package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/rabbit"
)

func TestPurgeTopicQueue_EmptiesOnlyTheTopicQueue(t *testing.T) {
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

	if _, err := purgeTopicQueue(ctx, cfg, "no spaces"); !errors.Is(err, broker.ErrInvalidTopic) {
		t.Fatalf("purgeTopicQueue(bad name) = %v, want ErrInvalidTopic", err)
	}
	n, err := purgeTopicQueue(ctx, cfg, topic)
	if err != nil || n != 3 {
		t.Fatalf("purgeTopicQueue = %d, %v; want the 3 due messages", n, err)
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
