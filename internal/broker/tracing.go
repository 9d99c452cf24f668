package broker

import (
	"context"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// A task's trace context is the W3C traceparent of the span that
// scheduled it, optionally followed by one space and the tracestate:
// "00-<trace id>-<span id>-<flags>[ <tracestate>]". A traceparent holds
// no space, so the first one splits the two.

// TraceOf returns the trace context of ctx's span in the form above, or
// "" when ctx carries no valid span context. A tracestate that would make
// it longer than MaxTraceLen is left out.
func TraceOf(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	tp := c.Get("traceparent")
	if ts := c.Get("tracestate"); ts != "" && len(tp)+1+len(ts) <= MaxTraceLen {
		return tp + " " + ts
	}
	return tp
}

// ParseTrace reads a trace context written by TraceOf (or by a producer
// in another language). ok is false when s holds no valid traceparent.
func ParseTrace(s string) (sc trace.SpanContext, ok bool) {
	if s == "" {
		return trace.SpanContext{}, false
	}
	tp, ts, _ := strings.Cut(s, " ")
	c := propagation.MapCarrier{"traceparent": tp}
	if ts != "" {
		c["tracestate"] = ts
	}
	sc = trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), c))
	return sc, sc.IsValid()
}

// Tracing is what the runtime and the publishers need to make spans: a
// tracer and the broker's messaging.system ("rabbitmq", "rocketmq"). The
// zero value makes none, and costs nothing.
type Tracing struct {
	Tracer trace.Tracer
	System string
}

// TracerName is the instrumentation scope of delaybridge's spans.
const TracerName = "github.com/delaybridge/delaybridge"

// NewTracing returns the Tracing of an adapter (by its Name, "rabbit" or
// "rocket") on tp; off when tp is nil.
func NewTracing(tp trace.TracerProvider, adapter string) Tracing {
	if tp == nil {
		return Tracing{}
	}
	system := adapter
	switch adapter {
	case "rabbit":
		system = "rabbitmq"
	case "rocket":
		system = "rocketmq"
	}
	return Tracing{Tracer: tp.Tracer(TracerName), System: system}
}

// On reports whether t makes spans.
func (t Tracing) On() bool { return t.Tracer != nil }

// Attribute keys of delaybridge's own span attributes.
const (
	attrTopic    = attribute.Key("delaybridge.topic")
	attrKey      = attribute.Key("delaybridge.key")
	attrDue      = attribute.Key("delaybridge.due")
	attrLateness = attribute.Key("delaybridge.lateness_ms")
	attrHop      = attribute.Key("delaybridge.hop")
	attrAttempt  = attribute.Key("delaybridge.attempt")
	attrOutcome  = attribute.Key("delaybridge.outcome")
	attrReason   = attribute.Key("delaybridge.reason")
)

// start begins a span for m: name "<operation> <topic>", linked to the
// span that scheduled m (a link, not a parent: that trace ended long
// ago), with the messaging attributes and the task's.
func (t Tracing) start(ctx context.Context, operation string, kind trace.SpanKind, opType attribute.KeyValue, m *Message, extra ...attribute.KeyValue) (context.Context, trace.Span) {
	attrs := append([]attribute.KeyValue{
		semconv.MessagingSystemKey.String(t.System),
		semconv.MessagingDestinationName(m.Topic),
		semconv.MessagingOperationName(operation),
		opType,
		attrTopic.String(m.Topic),
		attrKey.String(m.Key),
		attrDue.String(m.DeliverAt.UTC().Format(time.RFC3339Nano)),
		attrHop.Int(m.Hop),
		attrAttempt.Int(m.Attempt),
	}, extra...)
	if m.TaskID != 0 {
		attrs = append(attrs, semconv.MessagingMessageID(strconv.FormatInt(m.TaskID, 10)))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(kind), trace.WithAttributes(attrs...)}
	if sc, ok := ParseTrace(m.Trace); ok {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	return t.Tracer.Start(ctx, operation+" "+m.Topic, opts...)
}

// TracePublisher returns pub with a producer span around each message it
// publishes, named "<operation> <topic>" (the relay's "send", the
// scanner's "rescue"), ended with the broker's answer for that message.
// With t off it returns pub itself.
func TracePublisher(pub Publisher, t Tracing, operation string) Publisher {
	if !t.On() {
		return pub
	}
	return &tracedPublisher{Publisher: pub, t: t, op: operation}
}

type tracedPublisher struct {
	Publisher
	t  Tracing
	op string
}

func (p *tracedPublisher) Publish(ctx context.Context, msgs ...*Message) error {
	spans := make([]trace.Span, len(msgs))
	for i, m := range msgs {
		_, spans[i] = p.t.start(ctx, p.op, trace.SpanKindProducer, semconv.MessagingOperationTypeSend, m)
	}
	err := p.Publisher.Publish(ctx, msgs...)
	for i, r := range PublishResults(err, len(msgs)) {
		if r != nil {
			spans[i].RecordError(r)
			spans[i].SetStatus(codes.Error, r.Error())
		}
		spans[i].End()
	}
	return err
}

// SpanContext returns ctx carrying the span the consumer runtime made
// for m, so that the handler's own spans are its children; ctx itself
// when there is none (tracing off).
func SpanContext(ctx context.Context, m *Message) context.Context {
	if m == nil || m.span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, m.span)
}

// startSpan begins m's processing span, once: a message the runtime
// handles again after its group failed keeps the span it has.
func (c *Consumer) startSpan(m *Message, now time.Time) {
	if !c.cfg.tracing.On() || m.span != nil {
		return
	}
	_, m.span = c.cfg.tracing.start(context.Background(), "process", trace.SpanKindConsumer, semconv.MessagingOperationTypeProcess, m,
		attrLateness.Int64(max(now.Sub(m.DeliverAt), 0).Milliseconds()))
}

// endSpan ends m's processing span with the outcome the runtime chose
// (applied, skipped, retried, dead, waiting, released) and the handler's
// error, if any.
func endSpan(m *Message, outcome, reason string, err error) {
	if m == nil || m.span == nil {
		return
	}
	sp := m.span
	m.span = nil
	sp.SetAttributes(attrOutcome.String(outcome))
	if reason != "" {
		sp.SetAttributes(attrReason.String(reason))
	}
	if err != nil && outcome != string(OutcomeSkipped) {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}
