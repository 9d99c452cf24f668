package rocket_test

import (
	"context"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// A consumer group with no offset yet reads a topic from the first message
// the broker still has: a task published before its consumers first
// connected (a relay started before the consumers, a new GroupPrefix) is
// delivered, not skipped. The group is new for this test, the message is
// sent and confirmed before the group's first Subscribe. (A broker whose
// memory still holds the message starts such a group at it even for a
// client that asks for the end of the topic, so this shows what a user
// gets, not which of the two the subscriber asks for.)
func TestSubscriber_NewGroupStartsAtTheFirstMessage(t *testing.T) {
	e := setup(t)
	topic := brokertest.Topic(t)
	limits := rocket.TimerLimits(2*time.Second, localPrecision)
	pub, _ := e.clients(t, topic, limits)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	early := &broker.Message{Topic: topic, Key: "before-the-group", Payload: []byte("early"), DeliverAt: broker.MillisUTC(time.Now())}
	if err := pub.Publish(ctx, early); err != nil {
		t.Fatal(err)
	}

	cfg := e.config(limits)
	cfg.GroupPrefix = testenv.Name("dbt-first")
	sub := newSubscriber(t, cfg)
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	d := receive(t, ch)
	if d.Message == nil || d.Message.Key != "before-the-group" {
		t.Fatalf("first delivery of a new group is %+v (err %v), want the message sent before it existed", d.Message, d.Err)
	}
	if err := d.Acker.Ack(); err != nil {
		t.Fatal(err)
	}
}

func newSubscriber(t *testing.T, cfg rocket.Config) *rocket.Subscriber {
	t.Helper()
	sub, err := rocket.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sub.Close(); err != nil {
			t.Errorf("Subscriber.Close: %v", err)
		}
	})
	return sub
}
