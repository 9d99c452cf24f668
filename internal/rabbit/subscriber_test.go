package rabbit

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestSubscriber_AckOnDeadChannelFailsAndTheMessageComesBack(t *testing.T) {
	b := setup(t)
	topic := "deadack"
	pub, sub := b.clients(t, topic)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deliveries, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, &broker.Message{Topic: topic, Key: "once", DeliverAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	next := func() *broker.Delivery {
		t.Helper()
		select {
		case d := <-deliveries:
			return d
		case <-time.After(30 * time.Second):
			t.Fatal("no delivery")
			return nil
		}
	}
	first := next()
	pid := connectionPID(t, b.cfg.ConnectionName+" subscriber "+topic)
	testenv.Rabbitmqctl(t, "close_connection", pid, "delaybridge test: kill before the ack")
	again := next() // after the reconnect
	if err := first.Acker.Ack(); !errors.Is(err, errStale) {
		t.Errorf("Ack on the dead channel = %v, want errStale", err)
	}
	if again.Message == nil || again.Message.Key != "once" {
		t.Fatalf("redelivered %+v", again)
	}
	if err := again.Acker.Ack(); err != nil {
		t.Errorf("Ack after the reconnect: %v", err)
	}
	if err := again.Acker.Ack(); err == nil {
		t.Error("a second Ack of one delivery succeeded")
	}
}

func TestPublisherAndSubscriber_CloseStopsEveryGoroutine(t *testing.T) {
	b := setup(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	pub, err := NewPublisher(context.Background(), b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := NewSubscriber(b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.topic("leak")
	ctx, cancel := context.WithCancel(context.Background())
	deliveries, err := sub.Subscribe(ctx, "leak")
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, &broker.Message{Topic: "leak", Key: "k", DeliverAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	d := <-deliveries
	_ = d.Acker.Ack()
	cancel()
	for range deliveries {
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), &broker.Message{Topic: "leak", Key: "k", DeliverAt: time.Now()}); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
}

// Nack gives the delivery back to the queue, Ack removes it.
func TestSubscriber_NackRequeuesAckRemoves(t *testing.T) {
	b := setup(t)
	topic := "nack"
	pub, sub := b.clients(t, topic)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deliveries, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, &broker.Message{Topic: topic, Key: "back", DeliverAt: broker.MillisUTC(time.Now())}); err != nil {
		t.Fatal(err)
	}
	next := func(wait time.Duration) *broker.Delivery {
		select {
		case d := <-deliveries:
			return d
		case <-time.After(wait):
			return nil
		}
	}
	first := next(30 * time.Second)
	if first == nil || first.Message == nil || first.Message.Key != "back" {
		t.Fatalf("first delivery %+v", first)
	}
	if err := first.Acker.Nack(); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	again := next(10 * time.Second)
	if again == nil || again.Message == nil || again.Message.Key != "back" {
		t.Fatalf("after the Nack got %+v, want the message back", again)
	}
	if err := again.Acker.Ack(); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if d := next(500 * time.Millisecond); d != nil {
		t.Fatalf("delivered again after its Ack: %+v", d)
	}
	q, err := b.channel(t).QueueDeclarePassive(topology{cfg: b.cfg}.topicQueue(topic), true, false, false, false, quorum(nil))
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 0 {
		t.Errorf("%d messages left in the queue after the Ack", q.Messages)
	}
}
