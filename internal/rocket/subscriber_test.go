package rocket_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

func receive(t *testing.T, ch <-chan *broker.Delivery) *broker.Delivery {
	t.Helper()
	return receiveWithin(t, ch, 30*time.Second)
}

func receiveWithin(t *testing.T, ch <-chan *broker.Delivery, wait time.Duration) *broker.Delivery {
	t.Helper()
	select {
	case d, ok := <-ch:
		if !ok {
			t.Fatal("channel closed")
		}
		return d
	case <-time.After(wait):
		t.Fatalf("no delivery within %v", wait)
		return nil
	}
}

// The group is brand new; the harness made its retry topic with
// Subscriber.CreateTopic, so the given-back delivery returns after the
// broker's first delay level rather than after the client's first route
// refresh (30 to 40 s).
func TestSubscriber_NackedDeliveryComesBackToTheGroup(t *testing.T) {
	e := setup(t)
	topic := brokertest.Topic(t)
	pub, sub := e.clients(t, topic, rocket.TimerLimits(2*time.Second, localPrecision))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	m := &broker.Message{Topic: topic, Key: "nack-me", Payload: []byte("body"), DeliverAt: broker.MillisUTC(time.Now()), Headers: map[string]string{"h": "v"}}
	if err := pub.Publish(ctx, m); err != nil {
		t.Fatal(err)
	}
	first := receive(t, ch)
	if err := first.Acker.Nack(); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	if err := first.Acker.Ack(); err == nil {
		t.Error("a second settlement of the same delivery succeeded")
	}
	nacked := time.Now()
	again := receiveWithin(t, ch, 20*time.Second)
	t.Logf("redelivered %v after the Nack", time.Since(nacked))
	if again.Message == nil || again.Message.Key != "nack-me" || string(again.Message.Payload) != "body" || again.Message.Headers["h"] != "v" {
		t.Fatalf("redelivery differs: %+v (err %v)", again.Message, again.Err)
	}
	if err := again.Acker.Ack(); err != nil {
		t.Fatalf("Ack: %v", err)
	}
}

// The runtime gives a delivery back as often as its retries and hops
// need. The client's own limit (16 give-backs) would have the broker move
// it to the group's %DLQ% topic, out of the runtime's reach, where only
// the scanner's rescue, a grace late, would bring the task back: given
// back 17 times, the delivery still returns to the group.
func TestSubscriber_ADeliveryGivenBackMoreThanSixteenTimesStaysWithTheGroup(t *testing.T) {
	testenv.SkipIfShort(t, "gives one delivery back 17 times, a second each")
	e := setup(t)
	topic := brokertest.Topic(t)
	pub, sub := e.clients(t, topic, rocket.TimerLimits(2*time.Second, localPrecision))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, &broker.Message{Topic: topic, Key: "nack-many", Payload: []byte("body"), DeliverAt: broker.MillisUTC(time.Now())}); err != nil {
		t.Fatal(err)
	}
	const givenBack = 17
	for i := 0; i <= givenBack; i++ {
		d := receiveWithin(t, ch, time.Minute)
		if d.Message == nil || d.Message.Key != "nack-many" {
			t.Fatalf("delivery %d: %+v (err %v), want nack-many", i+1, d.Message, d.Err)
		}
		if i == givenBack {
			if err := d.Acker.Ack(); err != nil {
				t.Fatalf("Ack: %v", err)
			}
			return
		}
		if err := d.Acker.Nack(); err != nil {
			t.Fatalf("Nack %d: %v", i+1, err)
		}
	}
}

func TestSubscriber_ContextEndGivesBackUnsettledAndClosesChannel(t *testing.T) {
	e := setup(t)
	topic := brokertest.Topic(t)
	pub, sub := e.clients(t, topic, rocket.TimerLimits(2*time.Second, localPrecision))
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), &broker.Message{Topic: topic, Key: "held", DeliverAt: broker.MillisUTC(time.Now())}); err != nil {
		t.Fatal(err)
	}
	d := receive(t, ch)
	cancel()
	for range ch {
		// Drain until the subscription closes the channel.
	}
	if err := d.Acker.Ack(); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Ack after the subscription ended = %v, want an error matching broker.ErrClosed: the delivery was given back", err)
	}
	// A new subscriber in the same group gets it.
	_, sub2 := e.clients(t, topic, rocket.TimerLimits(2*time.Second, localPrecision))
	ch2, err := sub2.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	d2 := receive(t, ch2)
	if d2.Message == nil || d2.Message.Key != "held" {
		t.Fatalf("got %+v, want the given-back message", d2.Message)
	}
	_ = d2.Acker.Ack()
}

func TestSubscriber_SubscribeAfterCloseFails(t *testing.T) {
	e := setup(t)
	sub, err := rocket.NewSubscriber(e.config(rocket.TimerLimits(time.Hour, localPrecision)))
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Subscribe(context.Background(), "anything"); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Subscribe after Close = %v, want ErrClosed", err)
	}
}
