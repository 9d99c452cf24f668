package rocket_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/rocket"
)

func TestBroker_RefusesRawTimerDelayBeyondItsMax(t *testing.T) {
	e := setup(t)
	topic := brokertest.Topic(t)
	e.topic(t, topic)
	over := localTimerMaxDelay + 5*time.Minute
	for name, props := range map[string]map[string]string{
		"relative seconds": {"TIMER_DELAY_SEC": strconv.Itoa(int(over / time.Second))},
		"relative millis":  {"TIMER_DELAY_MS": strconv.FormatInt(over.Milliseconds(), 10)},
		"absolute":         {"TIMER_DELIVER_MS": strconv.FormatInt(time.Now().Add(over).UnixMilli(), 10)},
	} {
		t.Run(name, func(t *testing.T) {
			err := e.publishRaw(t, topic, props, []byte("too far"))
			if err == nil {
				t.Fatalf("the broker accepted a timer delay of %v, beyond timerMaxDelaySec %v", over, localTimerMaxDelay)
			}
			want := fmt.Sprintf("max delay %dms", localTimerMaxDelay.Milliseconds())
			if !strings.Contains(err.Error(), "CODE: 13") || !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q, want code 13 naming %q", err, want)
			}
		})
	}
}

func TestPublisher_HopBeyondBrokerMaxIsRejectedNamingBothLimits(t *testing.T) {
	e := setup(t)
	topic := brokertest.Topic(t)
	// Misconfigured: MaxHop above the broker's timerMaxDelaySec, and not
	// checked at start (TrustLimits), as when the broker's setting was
	// lowered after the publisher started.
	e.topic(t, topic)
	cfg := e.config(rocket.TimerLimits(2*time.Hour, localPrecision))
	cfg.TrustLimits = true
	pub, err := rocket.NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	m := &broker.Message{Topic: topic, Key: "too-far", DeliverAt: broker.MillisUTC(time.Now().Add(90 * time.Minute))}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = broker.PublishResults(pub.Publish(ctx, m), 1)[0]
	if !errors.Is(err, broker.ErrRejected) {
		t.Fatalf("Publish = %v, want an error matching broker.ErrRejected", err)
	}
	var re *rocket.RejectedError
	if !errors.As(err, &re) {
		t.Fatalf("Publish = %v, want a *rocket.RejectedError for the message", err)
	}
	if re.BrokerMaxDelay != localTimerMaxDelay || re.ConfiguredMaxHop != 2*time.Hour {
		t.Errorf("RejectedError says broker %v, configured %v; want %v and %v", re.BrokerMaxDelay, re.ConfiguredMaxHop, localTimerMaxDelay, 2*time.Hour)
	}
	if msg := re.Error(); !strings.Contains(msg, "1h0m0s") || !strings.Contains(msg, "2h0m0s") {
		t.Errorf("error text %q does not name both limits", msg)
	}
}

func TestDelayBeyondBrokerMax_ArrivesOnTimeThroughHops(t *testing.T) {
	e := setup(t)
	topic := brokertest.Topic(t)
	const maxHop, delay = 2 * time.Second, 7 * time.Second
	pub, sub := e.clients(t, topic, rocket.TimerLimits(maxHop, localPrecision))

	var mu sync.Mutex
	var handledAt time.Time
	var got *broker.Message
	hops := 0
	done := make(chan struct{})
	h := func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if got == nil {
			handledAt, got = time.Now(), m
			close(done)
		}
		return nil
	}
	cfg := broker.ConsumerConfig{HoldWindow: maxHop / 4, Hooks: broker.Hooks{Hopped: func(string, int) { mu.Lock(); hops++; mu.Unlock() }}}
	c, err := broker.NewConsumer(sub, pub, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })

	due := broker.MillisUTC(time.Now().Add(delay))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, &broker.Message{Topic: topic, Key: "hops", Payload: []byte("p"), DeliverAt: due}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(delay + 30*time.Second):
		t.Fatal("the message never arrived")
	}
	mu.Lock()
	defer mu.Unlock()
	if handledAt.Before(due) {
		t.Errorf("handled %v early", due.Sub(handledAt))
	}
	if late := handledAt.Sub(due); late > localPrecision+400*time.Millisecond {
		t.Errorf("handled %v late", late)
	}
	if hops < 3 || got.Hop < 3 {
		t.Errorf("%v with MaxHop %v took %d re-publishes (message says hop %d), want at least 3", delay, maxHop, hops, got.Hop)
	}
}

// A delivered timer message carries the broker's TIMER_OUT_MS and related
// properties; had they travelled into the re-publish, the broker would have
// delivered the next hop at once.
func TestHop_RepublishedTimerMessageWaitsItsDelay(t *testing.T) {
	e := setup(t)
	topic := brokertest.Topic(t)
	const maxHop = 2 * time.Second
	pub, sub := e.clients(t, topic, rocket.TimerLimits(maxHop, localPrecision))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	receive := func() *broker.Delivery {
		t.Helper()
		select {
		case d := <-ch:
			if d.Message == nil {
				t.Fatalf("undecodable delivery: %v", d.Err)
			}
			return d
		case <-time.After(30 * time.Second):
			t.Fatal("no delivery")
			return nil
		}
	}
	due := broker.MillisUTC(time.Now().Add(3 * maxHop))
	if err := pub.Publish(ctx, &broker.Message{Topic: topic, Key: "strip", DeliverAt: due}); err != nil {
		t.Fatal(err)
	}
	first := receive()
	if first.Headers["TIMER_OUT_MS"] == "" {
		t.Fatalf("the first hop arrived without TIMER_OUT_MS, so it proves nothing: %v", first.Headers)
	}
	next := first.Message.Clone()
	next.Hop++
	sent := time.Now()
	if err := pub.Publish(ctx, next); err != nil {
		t.Fatal(err)
	}
	if err := first.Acker.Ack(); err != nil {
		t.Fatal(err)
	}
	second := receive()
	waited := time.Since(sent)
	_ = second.Acker.Ack()
	if len(second.Message.Payload) != 0 {
		t.Errorf("an empty payload arrived as %q", second.Message.Payload)
	}
	if second.Message.Hop != 1 {
		t.Fatalf("second delivery is hop %d, want 1", second.Message.Hop)
	}
	if waited < maxHop-localPrecision {
		t.Errorf("the re-published hop arrived after %v, want about %v: a TIMER_* property leaked into it", waited, maxHop)
	}
}
