package rabbit

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delaybridge/delaybridge/broker"
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
