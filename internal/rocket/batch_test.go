package rocket_test

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rocket"
)

// Due messages the publisher sent in batches reach the consumer one by
// one, each with its own key, payload (an empty one too), headers, trace
// and attempt, and no earlier than due; a timed message sent in the same
// call arrives after its delay, not with the batch.
func TestPublisher_BatchedDueMessagesArriveEachWithItsOwnEnvelope(t *testing.T) {
	e := setup(t)
	topic := brokertest.Topic(t)
	pub, sub := e.clients(t, topic, rocket.TimerLimits(localTimerMaxDelay, localPrecision))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}

	now := time.Now()
	const n = 70 // three batches
	want := map[string]*broker.Message{}
	var msgs []*broker.Message
	for i := range n {
		m := &broker.Message{
			Topic: topic, Key: "batched-" + strconv.Itoa(i),
			Payload:   []byte("payload " + strconv.Itoa(i)),
			DeliverAt: broker.MillisUTC(now.Add(-time.Duration(i) * time.Millisecond)),
			Attempt:   i % 3, Trace: "trace-" + strconv.Itoa(i),
			Headers: map[string]string{"h": strconv.Itoa(i)},
		}
		if i == 7 {
			m.Payload = nil
		}
		want[m.Key] = m
		msgs = append(msgs, m)
	}
	timed := &broker.Message{Topic: topic, Key: "timed", Payload: []byte("t"), DeliverAt: broker.MillisUTC(now.Add(3 * time.Second))}
	want[timed.Key] = timed
	msgs = append(msgs, timed)
	if err := pub.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	receiveAll(t, ch, want, func(got *broker.Message, _ time.Time, left int) {
		if got.Key == "timed" && left > 0 {
			t.Errorf("the timed message arrived before %d of the due ones", left)
		}
		if got.Key == "timed" && time.Now().Before(timed.DeliverAt.Add(-localPrecision)) {
			t.Errorf("the timed message arrived %v before due, more than one precision", time.Until(timed.DeliverAt))
		}
	})
}

// receiveAll receives and acks one delivery of each message in want,
// checks that each carries the envelope it was sent with, and calls check
// with it, when it arrived and how many are still to come.
func receiveAll(t *testing.T, ch <-chan *broker.Delivery, want map[string]*broker.Message, check func(got *broker.Message, arrived time.Time, left int)) {
	t.Helper()
	for len(want) > 0 {
		d := receive(t, ch)
		if d.Err != nil {
			t.Fatalf("delivery not decoded: %v", d.Err)
		}
		got, arrived := d.Message, time.Now()
		w, ok := want[got.Key]
		if !ok {
			t.Fatalf("unexpected or repeated delivery %q", got.Key)
		}
		delete(want, got.Key)
		if !bytes.Equal(got.Payload, w.Payload) || got.Attempt != w.Attempt || got.Trace != w.Trace || got.Headers["h"] != w.Headers["h"] || !got.DeliverAt.Equal(w.DeliverAt) {
			t.Errorf("%s arrived as %+v, want %+v", got.Key, got, w)
		}
		check(got, arrived, len(want))
		if err := d.Acker.Ack(); err != nil {
			t.Fatal(err)
		}
	}
}

// Timed messages whose hops end in one slot of the wheel go in one batch
// that carries the delay itself (the broker ignores a delay inside a
// batch): they arrive together, no earlier than two precisions before due
// (one for the lead of the last hop, one for sharing the slot) and well
// before the consumer's patience runs out, each with its own envelope.
// Without the batch's delay they would arrive at once, seconds early.
func TestPublisher_TimedBatchArrivesWithTheWheelSlot(t *testing.T) {
	e := setup(t)
	topic := brokertest.Topic(t)
	pub, sub := e.clients(t, topic, rocket.TimerLimits(localTimerMaxDelay, localPrecision))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(3 * time.Second).Truncate(localPrecision).Add(localPrecision / 2)
	want := map[string]*broker.Message{}
	var msgs []*broker.Message
	for i := range 40 {
		m := &broker.Message{Topic: topic, Key: "timed-" + strconv.Itoa(i), Payload: []byte("p" + strconv.Itoa(i)),
			DeliverAt: broker.MillisUTC(due.Add(time.Duration(i%5) * time.Millisecond)), Headers: map[string]string{"h": strconv.Itoa(i)}}
		want[m.Key] = m
		msgs = append(msgs, m)
	}
	if err := pub.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	receiveAll(t, ch, want, func(got *broker.Message, arrived time.Time, _ int) {
		if early := got.DeliverAt.Sub(arrived); early > 2*localPrecision {
			t.Fatalf("%s arrived %v before due, more than two precisions: the batch's delay was not applied", got.Key, early)
		}
		if late := arrived.Sub(got.DeliverAt); late > 2*time.Second {
			t.Errorf("%s arrived %v after due", got.Key, late)
		}
	})
}

// With the default lead, a message due within it is stored at once as a
// plain message, off the timer wheel, and a message due later leaves the
// wheel a lead early: both arrive seconds before due, for the consumer to
// hold. Without the lead each would arrive a precision before due.
func TestPublisher_TheLeadDeliversTheLastSecondsEarlyForTheConsumerToHold(t *testing.T) {
	e := setup(t)
	topic := brokertest.Topic(t)
	_, sub := e.clients(t, topic, rocket.TimerLimits(localTimerMaxDelay, localPrecision))
	cfg := e.config(rocket.TimerLimits(localTimerMaxDelay, localPrecision))
	cfg.Lead = 0 // the default
	pub, err := rocket.NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	if got := pub.Limits().Precision; got != rocket.DefaultLead+localPrecision {
		t.Fatalf("Limits().Precision %v, want the lead and the wheel's, %v", got, rocket.DefaultLead+localPrecision)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	soon := &broker.Message{Topic: topic, Key: "soon", Payload: []byte("s"), DeliverAt: broker.MillisUTC(now.Add(2 * time.Second))}
	later := &broker.Message{Topic: topic, Key: "later", Payload: []byte("l"), DeliverAt: broker.MillisUTC(now.Add(rocket.DefaultLead + 5*time.Second))}
	if err := pub.Publish(ctx, soon, later); err != nil {
		t.Fatal(err)
	}
	receiveAll(t, ch, map[string]*broker.Message{"soon": soon, "later": later}, func(got *broker.Message, arrived time.Time, _ int) {
		early := got.DeliverAt.Sub(arrived)
		switch got.Key {
		case "soon":
			// Published with 2 s left: plain, so it arrives at once.
			if early < time.Second {
				t.Errorf("soon arrived %v before due, want over 1s: it went through the wheel", early)
			}
		case "later":
			// Off the wheel a lead and a precision before due; a second
			// of slack for a loaded box.
			if early < rocket.DefaultLead-time.Second || early > rocket.DefaultLead+2*localPrecision {
				t.Errorf("later arrived %v before due, want about the lead, %v", early, rocket.DefaultLead)
			}
		}
	})
}
