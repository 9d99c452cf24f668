package integration

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// A trace started where the order is placed reaches the handler that
// cancels it: on each broker, a task that takes hops on the way and a task
// whose message the broker lost, which the scanner publishes again, each
// run by a handler whose span links to the span that scheduled it.
func TestTracing_TheHandlersSpanLinksTheSchedulingSpanThroughAHopAndARescue(t *testing.T) {
	for _, tc := range []struct {
		name, system string
		adapter      func(t *testing.T) broker.Adapter
	}{
		{"rabbit", "rabbitmq", func(t *testing.T) broker.Adapter { return rabbit.New(rabbitConfig(t)) }},
		{"rocket", "rocketmq", func(t *testing.T) broker.Adapter {
			return rocket.New(rocket.Config{NameServers: strings.Split(testenv.RocketMQ(t), ","), Limits: rocket.TimerLimits(rocketHop, rocketPrec),
				GroupPrefix: testenv.Name("trace"), CreateTopics: true, BrokerAddr: testenv.RocketBrokerAddr()})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFlow(t)
			sr := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

			c, err := delaybridge.NewClient(f.db, delaybridge.Config{
				Broker: tc.adapter(t),
				// Every task at once, however far off: "hop" then needs hops.
				Relay:          &delaybridge.RelayConfig{IdleMax: 50 * time.Millisecond, Lookahead: -1},
				Scanner:        &delaybridge.ScannerConfig{Grace: time.Second, Interval: 200 * time.Millisecond},
				TracerProvider: tp,
				Logger:         quiet(),
			})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			inHandler := map[string]trace.SpanContext{}
			handledAt := map[string]time.Time{}
			if err := c.Handle(f.topic, func(ctx context.Context, tx *sql.Tx, m *delaybridge.Message) error {
				mu.Lock()
				defer mu.Unlock()
				inHandler[m.Key] = trace.SpanContextFromContext(ctx)
				handledAt[m.Key] = time.Now()
				return nil
			}); err != nil {
				t.Fatal(err)
			}

			// The order service: each task scheduled in a request's span.
			scheduling := map[string]trace.SpanContext{}
			due := map[string]time.Time{}
			schedule := func(key string, at time.Time) {
				t.Helper()
				ctx, sp := tp.Tracer("shop").Start(f.ctx, "POST /orders")
				defer sp.End()
				tx, err := f.db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback() //nolint:errcheck // a no-op after Commit
				if _, err := c.Schedule(ctx, tx, delaybridge.Task{Topic: f.topic, Key: key, DueAt: at}); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				scheduling[key], due[key] = sp.SpanContext(), at
			}
			// Lost: published as far as the table knows, but no broker has
			// it; only the scanner can bring it.
			schedule("lost", time.Now().Add(500*time.Millisecond))
			if _, err := f.db.Exec(`UPDATE delay_task SET state = 'published', published_ms = ? WHERE task_key = 'lost'`, time.Now().UnixMilli()); err != nil {
				t.Fatal(err)
			}
			// Hops: due further out than one hop of either broker (3.1 s
			// ladder, 2 s timer) plus the consumer's 5 s hold window, so it
			// arrives early and goes on another hop.
			schedule("hop", time.Now().Add(10*time.Second))

			if err := c.Start(f.ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_ = c.Stop(ctx)
			})
			process := func(key string) sdktrace.ReadOnlySpan {
				for _, s := range sr.Ended() {
					if s.Name() == "process "+f.topic && spanAttr(s, "delaybridge.key").AsString() == key {
						return s
					}
				}
				return nil
			}
			eventually(t, "both tasks handled and their spans ended", func() bool {
				return process("hop") != nil && process("lost") != nil
			})

			for _, key := range []string{"hop", "lost"} {
				s := process(key)
				mu.Lock()
				ran, at := inHandler[key], handledAt[key]
				mu.Unlock()
				if at.Before(due[key]) {
					t.Errorf("%s: handled at %v, before its due time %v", key, at, due[key])
				}
				if ran.SpanID() != s.SpanContext().SpanID() {
					t.Errorf("%s: the handler ran in span %v, not in the process span %v", key, ran.SpanID(), s.SpanContext().SpanID())
				}
				if links := s.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != scheduling[key].SpanID() || links[0].SpanContext.TraceID() != scheduling[key].TraceID() {
					t.Errorf("%s: process span links %v, want the scheduling span %v", key, links, scheduling[key].SpanID())
				}
				if got := spanAttr(s, "delaybridge.outcome").AsString(); got != "applied" {
					t.Errorf("%s: outcome %q, want applied", key, got)
				}
				if got := spanAttr(s, "messaging.system").AsString(); got != tc.system {
					t.Errorf("%s: messaging.system %q, want %q", key, got, tc.system)
				}
			}
			if hop := spanAttr(process("hop"), "delaybridge.hop").AsInt64(); hop < 1 {
				t.Errorf("hop: the handled message took %d hops, want at least 1 (the test must cross a hop)", hop)
			}
			// Who published what: the relay sent "hop" and never "lost";
			// the scanner published "lost" again. Both spans link to the
			// scheduling span too.
			sent := map[string]int{}
			for _, s := range sr.Ended() {
				key := spanAttr(s, "delaybridge.key").AsString()
				switch s.Name() {
				case "send " + f.topic, "rescue " + f.topic:
				default:
					continue
				}
				sent[s.Name()+"/"+key]++
				if links := s.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != scheduling[key].SpanID() {
					t.Errorf("%s of %s: links %v, want the scheduling span", s.Name(), key, links)
				}
				if s.SpanKind() != trace.SpanKindProducer {
					t.Errorf("%s of %s: kind %v, want producer", s.Name(), key, s.SpanKind())
				}
			}
			if sent["send "+f.topic+"/hop"] == 0 || sent["rescue "+f.topic+"/lost"] == 0 || sent["send "+f.topic+"/lost"] != 0 {
				t.Errorf("publish spans %v: want the relay's send of hop and the scanner's rescue of lost, and no send of lost", sent)
			}
		})
	}
}

func spanAttr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}
