package memory_test

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
)

func TestMemoryBroker_Conformance(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		limits broker.Limits
		early  time.Duration
	}{
		{name: "timer", limits: broker.Limits{MaxHop: 2 * time.Second, Precision: 100 * time.Millisecond}, early: 80 * time.Millisecond},
		{name: "levels", limits: broker.Limits{MaxHop: 2 * time.Second, Levels: []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}, Precision: 100 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := memory.New(memory.Config{Limits: tc.limits, Early: tc.early})
			t.Cleanup(func() { _ = b.Close() })
			brokertest.TestAdapter(t, brokertest.Harness{
				New: func(t *testing.T, topic string) (broker.Publisher, broker.Subscriber) { return b, b },
				PublishRaw: func(t *testing.T, topic string, headers map[string]string, body []byte) error {
					return b.PublishRaw(topic, headers, body)
				},
				// The timers are in-process, but a loaded machine can
				// stall the handler's goroutine for a while: late is
				// bounded by a second, as for RabbitMQ; early stays exact.
				Features: brokertest.Features{MaxHop: 2 * time.Second, LateBound: time.Second},
			})
		})
	}
}
