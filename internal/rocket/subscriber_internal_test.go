package rocket

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// fakeConsumer stands in for the push consumer a subscription shuts down.
type fakeConsumer struct{}

func (fakeConsumer) Suspend()        {}
func (fakeConsumer) Shutdown() error { return nil }

func newGuardSubscription() *subscription {
	return &subscription{topic: "t", pc: fakeConsumer{}, log: slog.Default(), out: make(chan *broker.Delivery), stop: make(chan struct{}), quit: make(chan struct{}), done: make(chan struct{})}
}

func guardExt(t *testing.T) *primitive.MessageExt {
	t.Helper()
	ext := &primitive.MessageExt{}
	ext.Topic = "t"
	ext.Body = []byte("p")
	ext.WithProperties(broker.Encode(guardMessage("k", time.Now())))
	return ext
}

// consumeAsync runs the client's callback for one message as the client
// would, in its own goroutine.
func consumeAsync(s *subscription, m *primitive.MessageExt) <-chan consumer.ConsumeResult {
	res := make(chan consumer.ConsumeResult, 1)
	go func() {
		r, _ := s.consume(context.Background(), m)
		res <- r
	}()
	return res
}

func wantResult(t *testing.T, what string, res <-chan consumer.ConsumeResult, want consumer.ConsumeResult) {
	t.Helper()
	select {
	case got := <-res:
		if got != want {
			t.Errorf("%s: the callback returned %v, want %v", what, got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the callback did not return", what)
	}
}

// The client's callback consumes the message (ConsumeSuccess) only when
// the runtime acked its delivery; a Nack, a delivery unsettled when the
// subscription stops, one that could not be handed out before it stopped
// and one arriving while it stops all go back to the broker.
func TestSubscriber_CallbackConsumesOnlyWhatTheRuntimeAcked(t *testing.T) {
	settled := func(name string, settle func(d *broker.Delivery), want consumer.ConsumeResult) {
		s := newGuardSubscription()
		res := consumeAsync(s, guardExt(t))
		d := <-s.out
		if d.Message == nil || d.Message.Key != "k" {
			t.Fatalf("%s: delivery %+v (%v)", name, d.Message, d.Err)
		}
		settle(d)
		wantResult(t, name, res, want)
	}
	settled("acked", func(d *broker.Delivery) { _ = d.Acker.Ack() }, consumer.ConsumeSuccess)
	settled("nacked", func(d *broker.Delivery) { _ = d.Acker.Nack() }, consumer.ConsumeRetryLater)

	s := newGuardSubscription()
	res := consumeAsync(s, guardExt(t))
	d := <-s.out
	close(s.stop)
	wantResult(t, "unsettled at stop", res, consumer.ConsumeRetryLater)
	if err := d.Acker.Ack(); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Ack after the delivery was given back = %v, want ErrClosed", err)
	}

	s = newGuardSubscription()
	res = consumeAsync(s, guardExt(t))
	time.Sleep(50 * time.Millisecond) // nobody reads s.out
	close(s.stop)
	wantResult(t, "never handed out", res, consumer.ConsumeRetryLater)

	s = newGuardSubscription()
	s.stopping = true
	wantResult(t, "arriving while stopping", consumeAsync(s, guardExt(t)), consumer.ConsumeRetryLater)

	// Acked, then the subscription stops before the callback saw the ack.
	a := &acker{result: make(chan bool, 1)}
	if err := a.Ack(); err != nil {
		t.Fatal(err)
	}
	if !a.abandon() {
		t.Error("a delivery acked before the stop was given back")
	}
	if err := a.Nack(); !errors.Is(err, errSettled) {
		t.Errorf("Nack after Ack = %v, want errSettled", err)
	}
}
