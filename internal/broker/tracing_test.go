package broker_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
)

// recorder is a tracer provider that keeps every ended span.
func recorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, sr
}

// scheduled starts and ends a span as an order service's request would,
// and returns it with the trace context Schedule records from it.
func scheduled(t *testing.T, tp trace.TracerProvider) (trace.SpanContext, string) {
	t.Helper()
	ctx, sp := tp.Tracer("shop").Start(context.Background(), "POST /orders")
	defer sp.End()
	tr := broker.TraceOf(ctx)
	if tr == "" {
		t.Fatal("TraceOf found no trace context in a context with a recording span")
	}
	return sp.SpanContext(), tr
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

func TestTrace_FormatAndParse(t *testing.T) {
	t.Parallel()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, err := trace.ParseTraceState("shop=a1,vendor=b2")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true})
	got := broker.TraceOf(trace.ContextWithSpanContext(context.Background(), sc))
	if want := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 shop=a1,vendor=b2"; got != want {
		t.Fatalf("TraceOf = %q, want %q", got, want)
	}
	back, ok := broker.ParseTrace(got)
	if !ok || back.TraceID() != tid || back.SpanID() != sid || !back.IsSampled() || back.TraceState().Get("vendor") != "b2" {
		t.Fatalf("ParseTrace(%q) = %v, %v: want the span context back with its tracestate", got, back, ok)
	}
	if broker.TraceOf(context.Background()) != "" {
		t.Fatal("TraceOf of a context without a span must be empty")
	}
	for _, bad := range []string{
		"", "not a traceparent", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "00-4bf92f3577b34da6a3ce929d0e0e4736",
	} {
		if _, ok := broker.ParseTrace(bad); ok {
			t.Errorf("ParseTrace(%q) = ok, want refused", bad)
		}
	}
	// A tracestate too long for the column is left out, the traceparent kept.
	long, err := trace.ParseTraceState("k=" + strings.Repeat("v", 250) + ",l=" + strings.Repeat("w", 250))
	if err != nil {
		t.Fatal(err)
	}
	got = broker.TraceOf(trace.ContextWithSpanContext(context.Background(), sc.WithTraceState(long)))
	if got != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || len(got) > broker.MaxTraceLen {
		t.Fatalf("TraceOf with a long tracestate = %q, want the traceparent alone", got)
	}
}

func TestConsumer_TracingSpansLinkTheSchedulingSpanAndRecordEachOutcome(t *testing.T) {
	t.Parallel()
	tp, sr := recorder(t)
	parent, tr := scheduled(t, tp)
	bd := setup(t, memory.Config{})
	var mu sync.Mutex
	inHandler := map[string][]trace.SpanContext{}
	failedOnce := false
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		inHandler[m.Key] = append(inHandler[m.Key], trace.SpanContextFromContext(ctx))
		switch m.Key {
		case "skip":
			return broker.Skip("cancelled")
		case "dead":
			return broker.Permanent(errors.New("order gone"))
		case "retry":
			if !failedOnce {
				failedOnce = true
				return errors.New("payment channel timed out")
			}
		}
		return nil
	}, broker.WithTracing(broker.ConsumerConfig{Backoff: broker.Backoff{Initial: 20 * time.Millisecond}},
		broker.NewTracing(tp, "rabbit")))
	due := broker.MillisUTC(time.Now())
	for _, k := range []string{"ok", "skip", "dead", "retry"} {
		m := &broker.Message{TaskID: 42, Topic: bd.topic, Key: k, DeliverAt: due, Trace: tr}
		if err := bd.b.Publish(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	process := func() []sdktrace.ReadOnlySpan {
		var out []sdktrace.ReadOnlySpan
		for _, s := range sr.Ended() {
			if s.Name() == "process orders" {
				out = append(out, s)
			}
		}
		return out
	}
	eventually(t, "five process spans", func() bool { return len(process()) == 5 })

	outcomes := map[string][]string{}
	for _, s := range process() {
		a := attrs(s)
		key := a["delaybridge.key"].AsString()
		outcomes[key] = append(outcomes[key], a["delaybridge.outcome"].AsString())
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("%s: kind %v, want consumer", key, s.SpanKind())
		}
		if s.Parent().IsValid() {
			t.Errorf("%s: the span has a parent; want a new trace linked to the scheduling span", key)
		}
		if links := s.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != parent.SpanID() || links[0].SpanContext.TraceID() != parent.TraceID() {
			t.Errorf("%s: links %v, want one to the scheduling span %v", key, links, parent.SpanID())
		}
		for k, want := range map[attribute.Key]string{
			"messaging.system": "rabbitmq", "messaging.destination.name": "orders", "messaging.operation.type": "process",
			"messaging.message.id": "42", "delaybridge.topic": "orders",
		} {
			if got := a[k].String(); got != want {
				t.Errorf("%s: %s = %q, want %q", key, k, got, want)
			}
		}
		// A retry's message is due at its next attempt.
		if got := a["delaybridge.due"].AsString(); key != "retry" && got != due.Format(time.RFC3339Nano) {
			t.Errorf("%s: delaybridge.due = %q, want %q", key, got, due.Format(time.RFC3339Nano))
		}
		if _, ok := a["delaybridge.lateness_ms"]; !ok {
			t.Errorf("%s: no delaybridge.lateness_ms", key)
		}
		mu.Lock()
		ran := false
		for _, sc := range inHandler[key] {
			ran = ran || sc.SpanID() == s.SpanContext().SpanID()
		}
		mu.Unlock()
		if !ran {
			t.Errorf("%s: the handler's context did not carry its span %v", key, s.SpanContext().SpanID())
		}
		if failed := s.Status().Code == codes.Error; failed != (key == "dead" || (key == "retry" && a["delaybridge.outcome"].AsString() == "retried")) {
			t.Errorf("%s (%s): status %v", key, a["delaybridge.outcome"].AsString(), s.Status())
		}
	}
	want := map[string]string{"ok": "applied", "skip": "skipped", "dead": "dead", "retry": "retried,applied"}
	for k, w := range want {
		if got := strings.Join(outcomes[k], ","); got != w {
			t.Errorf("%s: outcomes %q, want %q", k, got, w)
		}
	}
}

func TestConsumer_TracingGivesEachMessageOfAGroupItsOwnSpan(t *testing.T) {
	t.Parallel()
	tp, sr := recorder(t)
	_, tr := scheduled(t, tp)
	bd := setup(t, memory.Config{})
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	seen := map[trace.SpanID]string{}
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		once.Do(func() { close(started); <-release })
		return nil
	}, broker.WithTracing(broker.ConsumerConfig{Concurrency: 1, Group: func(ctx context.Context, msgs []*broker.Message) ([]error, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			seen[trace.SpanContextFromContext(broker.SpanContext(ctx, m)).SpanID()] = m.Key
		}
		return make([]error, len(msgs)), nil
	}}, broker.NewTracing(tp, "rocket")))
	bd.publish(t, "first", time.Now())
	<-started
	for _, k := range []string{"a", "b", "c"} {
		m := &broker.Message{Topic: bd.topic, Key: k, DeliverAt: broker.MillisUTC(time.Now()), Trace: tr}
		if err := bd.b.Publish(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "all delivered", func() bool { return bd.b.Stats().Delivered >= 4 })
	time.Sleep(100 * time.Millisecond)
	close(release)
	eventually(t, "four process spans", func() bool { return len(sr.Ended()) >= 5 })
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Fatalf("the group handler saw %d distinct spans for its 3 messages: %v", len(seen), seen)
	}
	for _, s := range sr.Ended() {
		if key, ok := seen[s.SpanContext().SpanID()]; ok {
			if got := attrs(s)["delaybridge.key"].AsString(); got != key || attrs(s)["messaging.system"].AsString() != "rocketmq" {
				t.Errorf("span %v: key %q system %q, want %q rocketmq", s.SpanContext().SpanID(), got, attrs(s)["messaging.system"].AsString(), key)
			}
			delete(seen, s.SpanContext().SpanID())
		}
	}
	if len(seen) != 0 {
		t.Fatalf("spans the group handler saw but that never ended: %v", seen)
	}
}

func TestConsumer_TracingOffMakesNoSpan(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	var mu sync.Mutex
	var got []trace.SpanContext
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, trace.SpanContextFromContext(ctx))
		return nil
	}, broker.WithTracing(broker.ConsumerConfig{}, broker.NewTracing(nil, "rabbit")))
	_, tr := scheduled(t, sdktrace.NewTracerProvider())
	m := &broker.Message{Topic: bd.topic, Key: "k", DeliverAt: broker.MillisUTC(time.Now()), Trace: tr}
	if err := bd.b.Publish(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	eventually(t, "handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 1 })
	mu.Lock()
	defer mu.Unlock()
	if got[0].IsValid() {
		t.Fatalf("tracing off, yet the handler's context carries span %v", got[0])
	}
}

// failing is a publisher whose every publish fails.
type failing struct{ broker.Publisher }

func (failing) Publish(context.Context, ...*broker.Message) error {
	return errors.New("connection refused")
}

func TestTracePublisher_OneSpanPerMessageWithTheBrokersAnswer(t *testing.T) {
	t.Parallel()
	tp, sr := recorder(t)
	parent, tr := scheduled(t, tp)
	b := memory.New(memory.Config{})
	t.Cleanup(func() { _ = b.Close() })
	on := broker.NewTracing(tp, "rocket")
	if broker.TracePublisher(b, broker.Tracing{}, "send") != broker.Publisher(b) {
		t.Fatal("TracePublisher with tracing off must return the publisher itself")
	}
	msgs := []*broker.Message{
		{TaskID: 7, Topic: "orders", Key: "a", DeliverAt: broker.MillisUTC(time.Now().Add(time.Hour)), Trace: tr},
		{TaskID: 8, Topic: "orders", Key: "b", DeliverAt: broker.MillisUTC(time.Now().Add(time.Hour))},
	}
	if err := broker.TracePublisher(b, on, "send").Publish(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	if err := broker.TracePublisher(failing{b}, on, "rescue").Publish(context.Background(), msgs[0]); err == nil {
		t.Fatal("the failing publisher's error was lost")
	}
	spans := sr.Ended()[1:] // the first is the scheduling span
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	for i, want := range []struct {
		name, key string
		linked    bool
		failed    bool
	}{{"send orders", "a", true, false}, {"send orders", "b", false, false}, {"rescue orders", "a", true, true}} {
		s := spans[i]
		if s.Name() != want.name || attrs(s)["delaybridge.key"].AsString() != want.key || s.SpanKind() != trace.SpanKindProducer {
			t.Errorf("span %d: %q key %q kind %v, want %q %q producer", i, s.Name(), attrs(s)["delaybridge.key"].AsString(), s.SpanKind(), want.name, want.key)
		}
		if linked := len(s.Links()) == 1 && s.Links()[0].SpanContext.SpanID() == parent.SpanID(); linked != want.linked {
			t.Errorf("span %d: linked to the scheduling span %v, want %v", i, linked, want.linked)
		}
		if failed := s.Status().Code == codes.Error; failed != want.failed {
			t.Errorf("span %d: status %v, want failed %v", i, s.Status(), want.failed)
		}
		if attrs(s)["messaging.operation.type"].AsString() != "send" || attrs(s)["messaging.system"].AsString() != "rocketmq" {
			t.Errorf("span %d: attributes %v", i, s.Attributes())
		}
	}
}

// discard is a span exporter that drops what it is given.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkConsumer_Tracing runs messages through the consumer runtime on
// the in-memory broker with tracing off, and on with the SDK batching
// spans to an exporter that drops them: what tracing adds per message.
func BenchmarkConsumer_Tracing(b *testing.B) {
	for _, tc := range []struct {
		name string
		tp   trace.TracerProvider
	}{
		{"off", nil},
		{"on", sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))},
	} {
		b.Run(tc.name, func(b *testing.B) {
			_, tr := scheduled(&testing.T{}, sdktrace.NewTracerProvider())
			mb := memory.New(memory.Config{})
			defer mb.Close()
			var handled sync.WaitGroup
			c, err := broker.NewConsumer(mb, mb, func(ctx context.Context, m *broker.Message) error {
				handled.Done()
				return nil
			}, broker.WithTracing(broker.ConsumerConfig{Logger: quiet()}, broker.NewTracing(tc.tp, "rabbit")))
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Start(context.Background(), "orders"); err != nil {
				b.Fatal(err)
			}
			defer c.Close(context.Background()) //nolint:errcheck
			due := broker.MillisUTC(time.Now())
			b.ReportAllocs()
			b.ResetTimer()
			handled.Add(b.N)
			for i := range b.N {
				m := &broker.Message{TaskID: int64(i + 1), Topic: "orders", Key: "k", DeliverAt: due, Trace: tr}
				if err := mb.Publish(context.Background(), m); err != nil {
					b.Fatal(err)
				}
			}
			handled.Wait()
		})
	}
}
