package rocket_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rocket"
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

// A delay beyond MaxHop goes out as a chain of timer hops, none longer
// than MaxHop, the last of them scheduled no later than the due time (one
// precision before it, rocket.PlanHop). The test reads
// what each hop asked the broker for and what the broker scheduled from the
// properties the broker delivers, rather than timing the handler closely:
// on a loaded box one GC pause or fsync stall, in the broker or here, makes
// a delivery seconds late with nothing wrong in the chain. A lost hop still
// shows as an early arrival, and an extra or overlong one as a last hop
// scheduled after the due time.
func TestDelayBeyondBrokerMax_ArrivesOnTimeThroughHops(t *testing.T) {
	e := setup(t)
	topic := brokertest.Topic(t)
	const maxHop, delay = 2 * time.Second, 7 * time.Second
	limits := rocket.TimerLimits(maxHop, localPrecision)
	pub, sub := e.clients(t, topic, limits)
	rec := newHopRecorder(pub, sub)

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
	c, err := broker.NewConsumer(rec, rec, h, cfg)
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
	if err := rec.Publish(ctx, &broker.Message{Topic: topic, Key: "hops", Payload: []byte("p"), DeliverAt: due}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(delay + 30*time.Second):
		t.Fatal("the message never arrived")
	}
	// Closed, the consumer has run the Hopped hook of every hop it made.
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Consumer.Close: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if handledAt.Before(due) {
		t.Errorf("handled %v early", due.Sub(handledAt))
	}

	// Every hop waited in the broker's wheel, for no longer than MaxHop.
	for hop := 0; hop <= got.Hop; hop++ {
		if len(rec.props[hop]) == 0 {
			t.Errorf("hop %d of %d was never delivered", hop, got.Hop)
		}
		for _, p := range rec.props[hop] {
			ms, err := strconv.ParseInt(p["TIMER_DELAY_MS"], 10, 64)
			if d := time.Duration(ms) * time.Millisecond; err != nil || d <= 0 || d > maxHop {
				t.Errorf("hop %d arrived with TIMER_DELAY_MS %q, want a delay of at most MaxHop %v", hop, p["TIMER_DELAY_MS"], maxHop)
			}
		}
	}
	// The hop handed to the handler was scheduled by the broker for one
	// precision before the due time (TIMER_OUT_MS is the start of the
	// wheel's slot, which delivers at its end). Its delay is computed right
	// before the send and counted from the broker's receipt, so the time
	// its Publish took may add to it; a last hop planned a whole MaxHop,
	// or from a stale clock, lands far later.
	if ps := rec.props[got.Hop]; len(ps) > 0 {
		out, err := strconv.ParseInt(ps[0]["TIMER_OUT_MS"], 10, 64)
		if err != nil {
			t.Fatalf("hop %d arrived without the broker's TIMER_OUT_MS: %v", got.Hop, ps[0])
		}
		took, ok := rec.sends[got.Hop]
		if !ok {
			t.Fatalf("no confirmed Publish of hop %d was recorded", got.Hop)
		}
		if late := time.UnixMilli(out).Sub(due.Add(-localPrecision)); late > took {
			t.Errorf("the broker scheduled hop %d %v after one precision before the due time; its Publish took %v", got.Hop, late, took)
		}
	}
	// Past the broker's schedule, lateness is the broker's and this
	// process's scheduling, which a loaded box stretches by seconds; the
	// bound only catches a delivery that went astray.
	if late := handledAt.Sub(due); late > 5*time.Second {
		t.Errorf("handled %v late", late)
	}
	// A chain that runs late needs fewer hops, never more: each hop but the
	// last covers MaxHop of the delay, less at most the broker's precision.
	// A hop whose Publish timed out after the broker stored it starts a
	// second chain, whose hops the hook counts too.
	if most := limits.MaxHops(delay) - 1; got.Hop < 1 || got.Hop > most || hops < got.Hop {
		t.Errorf("%v with MaxHop %v took %d re-publishes (message says hop %d), want 1 to %d", delay, maxHop, hops, got.Hop, most)
	}
	for hop := 0; hop <= got.Hop; hop++ {
		if ps := rec.props[hop]; len(ps) > 0 {
			t.Logf("hop %d: Publish took %v, TIMER_DELAY_MS %s, TIMER_OUT_MS %s (due %d)", hop, rec.sends[hop], ps[0]["TIMER_DELAY_MS"], ps[0]["TIMER_OUT_MS"], due.UnixMilli())
		}
	}
	t.Logf("handled %v after the due time", handledAt.Sub(due))
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

// hopRecorder wraps the consumer's publisher and subscriber to record what
// each hop of a chain asked the broker for and what the broker scheduled.
type hopRecorder struct {
	pub broker.Publisher
	sub broker.Subscriber

	mu    sync.Mutex
	sends map[int]time.Duration       // hop -> how long its confirmed Publish took
	props map[int][]map[string]string // hop -> broker properties of each delivery
}

func newHopRecorder(pub broker.Publisher, sub broker.Subscriber) *hopRecorder {
	return &hopRecorder{pub: pub, sub: sub, sends: map[int]time.Duration{}, props: map[int][]map[string]string{}}
}

func (r *hopRecorder) Limits() broker.Limits { return r.pub.Limits() }

func (r *hopRecorder) Publish(ctx context.Context, msgs ...*broker.Message) error {
	start := time.Now()
	err := r.pub.Publish(ctx, msgs...)
	took := time.Since(start)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, res := range broker.PublishResults(err, len(msgs)) {
		if res == nil {
			r.sends[msgs[i].Hop] = took
		}
	}
	return err
}

func (r *hopRecorder) Subscribe(ctx context.Context, topic string) (<-chan *broker.Delivery, error) {
	in, err := r.sub.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *broker.Delivery)
	go func() {
		// The consumer reads its channel until it is closed, so this
		// never blocks it for longer than it takes to hand one on.
		defer close(out)
		for d := range in {
			if d.Message != nil {
				r.mu.Lock()
				r.props[d.Message.Hop] = append(r.props[d.Message.Hop], maps.Clone(d.Headers))
				r.mu.Unlock()
			}
			out <- d
		}
	}()
	return out, nil
}
