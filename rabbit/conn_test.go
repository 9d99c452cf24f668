package rabbit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
)

func TestPurgeTopic_EmptiesOnlyTheTopicQueue(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	const topic = "purge"
	pub, _ := b.clients(t, topic)
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

	if _, err := PurgeTopic(ctx, b.cfg, "no spaces"); !errors.Is(err, broker.ErrInvalidTopic) {
		t.Fatalf("PurgeTopic(bad name) = %v, want ErrInvalidTopic", err)
	}
	n, err := PurgeTopic(ctx, b.cfg, topic)
	if err != nil || n != 3 {
		t.Fatalf("PurgeTopic = %d, %v; want the 3 due messages", n, err)
	}

	ch := b.channel(t)
	topo := topology{cfg: b.cfg}
	if q, err := ch.QueueDeclarePassive(topo.topicQueue(topic), true, false, false, false, nil); err != nil || q.Messages != 0 {
		t.Fatalf("topic queue after purge: %+v, %v", q, err)
	}
	onLadder := 0
	for k := range testDepth {
		q, err := ch.QueueDeclarePassive(topo.levelQueue(k), true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		onLadder += q.Messages
	}
	if onLadder != 1 {
		t.Fatalf("%d messages on the ladder after the purge, want the 1 due later", onLadder)
	}
}
