package brokertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/wire"
)

// Features says what the adapter under test can do and how precise it is.
type Features struct {
	// MaxHop is the hop limit the harness gave the adapter. The suite sends
	// a delay of several times it and expects several hops. Keep it small
	// (a few seconds) so the suite stays short.
	MaxHop time.Duration
	// LateBound is how late after DeliverAt a message may be handled in an
	// idle system: the broker's precision plus scheduling slack.
	LateBound time.Duration
	// Burst is how many messages the burst test sends. Default 2000.
	Burst int
	// BurstWait bounds how long the burst may take to drain. Default 60s.
	BurstWait time.Duration
	// HeadersAlwaysUTF8 says the broker's wire format cannot carry invalid
	// UTF-8 in a header: RocketMQ's client serialises properties as JSON,
	// which turns each bad byte into U+FFFD. A foreign message with such a
	// header then arrives valid, and the suite expects it handled rather
	// than dead.
	HeadersAlwaysUTF8 bool
}

// Harness connects the suite to one adapter on its real broker.
type Harness struct {
	// New returns a publisher and a subscriber on the real broker, set up for
	// topic, with the hop limit Features.MaxHop. It registers their cleanup
	// with t.Cleanup. Each call may return new clients; the suite calls it
	// again to stand up a second consumer.
	New func(t *testing.T, topic string) (broker.Publisher, broker.Subscriber)
	// PublishRaw puts a message with exactly these headers and body on
	// topic's consumer queue, as a foreign producer would. It returns the
	// broker's refusal, if it refused the message (one with headers beyond
	// the broker's limits, say).
	PublishRaw func(t *testing.T, topic string, headers map[string]string, body []byte) error
	// PublishRawValues, when set, does what PublishRaw does with header
	// values of any type the broker's protocol has: int64, int32, bool,
	// float64, []byte, time.Time, map[string]any (a nested table) and
	// []any. Leave it nil for a broker whose headers are strings only.
	PublishRawValues func(t *testing.T, topic string, headers map[string]any, body []byte) error
	// Features describe the adapter.
	Features Features
}

// TestAdapter runs the conformance suite. Each subtest uses its own topic.
func TestAdapter(t *testing.T, h Harness) {
	f := h.Features
	if f.Burst == 0 {
		f.Burst = 2000
	}
	if f.BurstWait == 0 {
		f.BurstWait = 60 * time.Second
	}
	if f.MaxHop <= 0 || f.LateBound <= 0 {
		t.Fatal("brokertest: Features.MaxHop and Features.LateBound must be set")
	}
	h.Features = f
	t.Run("ShortDelayArrivesOnTimeNeverEarly", func(t *testing.T) { testShortDelay(t, h) })
	t.Run("DelayLongerThanHopLimitArrivesViaHops", func(t *testing.T) { testLongDelay(t, h) })
	t.Run("BurstAllArrive", func(t *testing.T) { testBurst(t, h) })
	t.Run("FailingHandlerRetriesThenGoesDead", func(t *testing.T) { testRetryDead(t, h) })
	t.Run("MalformedMessageGoesDeadWithoutBlocking", func(t *testing.T) { testMalformed(t, h) })
	t.Run("ForeignMessagesGoToTheDeadTopicWithAReason", func(t *testing.T) { testForeign(t, h) })
	t.Run("PanickingAndStuckHandlersGoDeadWithoutBlocking", func(t *testing.T) { testPanicAndStuck(t, h) })
	t.Run("ConsumerClosedMidFlightLosesNothing", func(t *testing.T) { testCloseMidFlight(t, h) })
}

// Topic returns a fresh topic name for one test.
func Topic(t *testing.T) string {
	return fmt.Sprintf("bt-%d-%06d", time.Now().UnixMilli(), rand.IntN(1_000_000))
}

// record is what a handler saw for one key.
type record struct {
	at  time.Time
	msg *broker.Message
}

// recorder collects handled messages and dead letters.
type recorder struct {
	mu      sync.Mutex
	handled map[string][]record
	dead    map[string]error
	changed chan struct{}
	// malformed counts undecodable deliveries; their reasons in order.
	malformed        int
	malformedReasons []error
}

func newRecorder() *recorder {
	return &recorder{handled: map[string][]record{}, dead: map[string]error{}, changed: make(chan struct{}, 1)}
}

func (r *recorder) handle(ctx context.Context, m *broker.Message) error {
	r.mu.Lock()
	r.handled[m.Key] = append(r.handled[m.Key], record{at: time.Now(), msg: m})
	r.mu.Unlock()
	r.notify()
	return nil
}

func (r *recorder) Dead(ctx context.Context, d *broker.Delivery, reason error) error {
	key := "malformed"
	if d.Message != nil {
		key = d.Message.Key
	}
	r.mu.Lock()
	r.dead[key] = reason
	if d.Message == nil {
		r.malformed++
		r.malformedReasons = append(r.malformedReasons, reason)
	}
	r.mu.Unlock()
	r.notify()
	return nil
}

func (r *recorder) notify() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// waitFor polls cond, which runs under the recorder's lock, until it holds
// or the timeout passes.
func (r *recorder) waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-deadline:
			r.mu.Lock()
			n, d := len(r.handled), len(r.dead)
			r.mu.Unlock()
			t.Fatalf("brokertest: timed out after %v waiting for %s (handled %d keys, dead %d)", timeout, what, n, d)
		case <-r.changed:
		case <-tick.C:
		}
	}
}

func startConsumer(t *testing.T, h Harness, topic string, handler broker.Handler, dl broker.DeadLetter, cfg broker.ConsumerConfig) (*broker.Consumer, broker.Publisher) {
	t.Helper()
	pub, sub := h.New(t, topic)
	cfg.DeadLetter = dl
	c, err := broker.NewConsumer(sub, pub, handler, cfg)
	if err != nil {
		t.Fatalf("NewConsumer: %v", err)
	}
	if err := c.Start(context.Background(), topic); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c, pub
}

func message(topic, key string, due time.Time) *broker.Message {
	return &broker.Message{Topic: topic, Key: key, Payload: []byte("payload-" + key), DeliverAt: broker.MillisUTC(due)}
}

func publish(t *testing.T, pub broker.Publisher, msgs ...*broker.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, msgs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
}

// checkOnTime fails for each key handled before its DeliverAt or later than
// the bound, and for each payload that did not survive the trip.
func checkOnTime(t *testing.T, r *recorder, sent []*broker.Message, late time.Duration) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range sent {
		recs := r.handled[m.Key]
		if len(recs) == 0 {
			t.Errorf("key %s never handled", m.Key)
			continue
		}
		first := recs[0]
		if first.at.Before(m.DeliverAt) {
			t.Errorf("key %s handled %v EARLY (due %s, handled %s)", m.Key, m.DeliverAt.Sub(first.at), m.DeliverAt.Format(time.StampMilli), first.at.Format(time.StampMilli))
		}
		if l := first.at.Sub(m.DeliverAt); l > late {
			t.Errorf("key %s handled %v late, more than the bound %v", m.Key, l, late)
		}
		if string(first.msg.Payload) != string(m.Payload) || first.msg.Topic != m.Topic || !first.msg.DeliverAt.Equal(m.DeliverAt) {
			t.Errorf("key %s arrived changed: topic %q payload %q due %s", m.Key, first.msg.Topic, first.msg.Payload, first.msg.DeliverAt)
		}
	}
}

func testShortDelay(t *testing.T, h Harness) {
	topic := Topic(t)
	r := newRecorder()
	_, pub := startConsumer(t, h, topic, r.handle, r, broker.ConsumerConfig{})
	now := time.Now()
	var sent []*broker.Message
	for i, d := range []time.Duration{500 * time.Millisecond, 1 * time.Second, 1500 * time.Millisecond, 2 * time.Second, 0} {
		sent = append(sent, message(topic, fmt.Sprintf("short-%d", i), now.Add(d)))
	}
	sent[4].Payload = nil // an empty payload must survive too
	sent[0].Headers = map[string]string{"trace-note": "kept"}
	sent[0].Trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	publish(t, pub, sent...)
	r.waitFor(t, 2*time.Second+h.Features.LateBound+10*time.Second, "all short delays", func() bool { return len(r.handled) == len(sent) })
	checkOnTime(t, r, sent, h.Features.LateBound)
	r.mu.Lock()
	got := r.handled["short-0"][0].msg
	r.mu.Unlock()
	if got.Headers["trace-note"] != "kept" || got.Trace != sent[0].Trace {
		t.Errorf("headers or trace lost: %v %q", got.Headers, got.Trace)
	}
}

func testLongDelay(t *testing.T, h Harness) {
	topic := Topic(t)
	r := newRecorder()
	hops := 0
	var mu sync.Mutex
	cfg := broker.ConsumerConfig{HoldWindow: h.Features.MaxHop / 4, Hooks: broker.Hooks{Hopped: func(string, int) { mu.Lock(); hops++; mu.Unlock() }}}
	_, pub := startConsumer(t, h, topic, r.handle, r, cfg)
	delay := 3*h.Features.MaxHop + h.Features.MaxHop/2
	sent := []*broker.Message{message(topic, "long-0", time.Now().Add(delay))}
	publish(t, pub, sent...)
	r.waitFor(t, delay+h.Features.LateBound+30*time.Second, "the long delay", func() bool { return len(r.handled) == 1 })
	checkOnTime(t, r, sent, h.Features.LateBound)
	mu.Lock()
	defer mu.Unlock()
	if hops < 3 {
		t.Errorf("a delay of %v with a hop limit of %v took %d re-publishes, want at least 3", delay, h.Features.MaxHop, hops)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := r.handled["long-0"][0].msg.Hop; got < 3 {
		t.Errorf("the delivered message says hop %d, want at least 3", got)
	}
}

func testBurst(t *testing.T, h Harness) {
	topic := Topic(t)
	r := newRecorder()
	_, pub := startConsumer(t, h, topic, r.handle, r, broker.ConsumerConfig{Concurrency: 16})
	due := time.Now().Add(time.Second)
	n := h.Features.Burst
	msgs := make([]*broker.Message, n)
	for i := range msgs {
		msgs[i] = message(topic, fmt.Sprintf("burst-%d", i), due)
	}
	for i := 0; i < n; i += 500 {
		publish(t, pub, msgs[i:min(i+500, n)]...)
	}
	r.waitFor(t, h.Features.BurstWait, fmt.Sprintf("%d burst messages", n), func() bool { return len(r.handled) == n })
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		if recs := r.handled[m.Key]; len(recs) == 0 || recs[0].at.Before(m.DeliverAt) {
			t.Fatalf("key %s missing or early: %v", m.Key, recs)
		}
	}
}

func testRetryDead(t *testing.T, h Harness) {
	topic := Topic(t)
	r := newRecorder()
	var mu sync.Mutex
	calls := map[string][]int{}
	failing := func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		calls[m.Key] = append(calls[m.Key], m.Attempt)
		mu.Unlock()
		if m.Key == "poison" {
			return broker.Permanent(errors.New("cannot parse payload"))
		}
		return errors.New("downstream unavailable")
	}
	cfg := broker.ConsumerConfig{MaxAttempts: 3, Backoff: broker.Backoff{Initial: 200 * time.Millisecond, Max: 400 * time.Millisecond, Multiplier: 2, Jitter: 0.1}}
	_, pub := startConsumer(t, h, topic, failing, r, cfg)
	publish(t, pub, message(topic, "flaky", time.Now()), message(topic, "poison", time.Now()))
	r.waitFor(t, 30*time.Second+3*h.Features.LateBound, "both messages dead", func() bool { return len(r.dead) == 2 })
	mu.Lock()
	defer mu.Unlock()
	if got := calls["flaky"]; len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != 2 {
		t.Errorf("flaky: handler saw attempts %v, want [0 1 2]", got)
	}
	if got := calls["poison"]; len(got) != 1 {
		t.Errorf("poison: handler ran %d times, want 1 (permanent errors are not retried)", len(got))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.dead["flaky"]; err == nil || !strings.Contains(err.Error(), "downstream unavailable") {
		t.Errorf("flaky dead reason %v does not carry the last error", err)
	}
}

func testMalformed(t *testing.T, h Harness) {
	topic := Topic(t)
	r := newRecorder()
	_, pub := startConsumer(t, h, topic, r.handle, r, broker.ConsumerConfig{})
	publishRaw(t, h, topic, map[string]string{"foreign": "yes"}, []byte("not ours"))
	// An envelope whose due time is not a number, and one due in 9999.
	bad := broker.Encode(message(topic, "bad-due", time.Now()))
	bad[wire.HeaderDeliverAt] = "tomorrow"
	publishRaw(t, h, topic, bad, []byte("x"))
	far := broker.Encode(message(topic, "year-9999", time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)))
	publishRaw(t, h, topic, far, []byte("x"))
	publish(t, pub, message(topic, "good-after-malformed", time.Now()))
	r.waitFor(t, 20*time.Second+h.Features.LateBound, "the malformed messages dead and the good one handled", func() bool {
		return r.dead["malformed"] != nil && r.dead["year-9999"] != nil && r.malformed >= 2 && len(r.handled["good-after-malformed"]) > 0
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if !errors.Is(r.dead["year-9999"], broker.ErrTooFar) {
		t.Errorf("year-9999 dead reason = %v, want ErrTooFar", r.dead["year-9999"])
	}
	var noEnvelope, badDue bool
	for _, reason := range r.malformedReasons {
		noEnvelope = noEnvelope || errors.Is(reason, broker.ErrNoEnvelope)
		var ee *broker.EnvelopeError
		badDue = badDue || (errors.As(reason, &ee) && ee.Header == wire.HeaderDeliverAt)
	}
	if !noEnvelope || !badDue {
		t.Errorf("dead reasons %v: want one ErrNoEnvelope and one EnvelopeError naming %s", r.malformedReasons, wire.HeaderDeliverAt)
	}
}

func publishRaw(t *testing.T, h Harness, topic string, headers map[string]string, body []byte) {
	t.Helper()
	if err := h.PublishRaw(t, topic, headers, body); err != nil {
		t.Fatalf("PublishRaw: %v", err)
	}
}

func testCloseMidFlight(t *testing.T, h Harness) {
	topic := Topic(t)
	const n = 20
	release := make(chan struct{})
	first := newRecorder()
	blocking := func(ctx context.Context, m *broker.Message) error {
		first.mu.Lock()
		first.handled[m.Key] = append(first.handled[m.Key], record{at: time.Now(), msg: m})
		first.mu.Unlock()
		first.notify()
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c1, pub := startConsumer(t, h, topic, blocking, first, broker.ConsumerConfig{Concurrency: 4})
	msgs := make([]*broker.Message, n)
	for i := range msgs {
		msgs[i] = message(topic, fmt.Sprintf("inflight-%d", i), time.Now())
	}
	publish(t, pub, msgs...)
	first.waitFor(t, 20*time.Second+h.Features.LateBound, "the first consumer to be busy", func() bool { return len(first.handled) >= 4 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := c1.Close(ctx)
	cancel()
	if err == nil {
		t.Fatal("Close returned nil while handlers were blocked past its deadline")
	}
	close(release)

	second := newRecorder()
	startConsumer(t, h, topic, second.handle, second, broker.ConsumerConfig{})
	second.waitFor(t, 60*time.Second, "every message at the second consumer", func() bool { return len(second.handled) == n })
}
