package broker

import (
	"context"
	"testing"
	"time"
)

// With no tracer provider the runtime's tracing hooks allocate nothing and
// make no span: off costs a nil check per message, not an allocation.
func TestTracingOff_AllocatesNothingAndMakesNoSpan(t *testing.T) {
	c := &Consumer{}
	ctx := context.Background()
	m := &Message{Topic: "orders", Key: "k", DeliverAt: time.Now(), Trace: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	var pub Publisher
	now := time.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		c.startSpan(m, now)
		if SpanContext(ctx, m) != ctx {
			t.Fatal("tracing off, yet the handler's context changed")
		}
		endSpan(m, "applied", "", nil)
		if TraceOf(ctx) != "" {
			t.Fatal("a context without a span has a trace")
		}
		if TracePublisher(pub, Tracing{}, "send") != pub {
			t.Fatal("tracing off wrapped the publisher")
		}
	})
	if allocs != 0 {
		t.Fatalf("tracing off allocates %v times per message, want 0", allocs)
	}
	if m.span != nil {
		t.Fatal("tracing off made a span")
	}
}
