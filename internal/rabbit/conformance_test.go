package rabbit

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/wire"
)

func TestLadder_PassesBrokerConformanceSuite(t *testing.T) {
	b := setup(t)
	brokertest.TestAdapter(t, b.harness(brokertest.Features{
		MaxHop:    LadderMaxHop(testUnit, testDepth),
		LateBound: time.Second,
	}))
}

// harness runs the conformance suite on the bundle's configuration.
func (b *bundle) harness(f brokertest.Features) brokertest.Harness {
	return brokertest.Harness{
		New: func(t *testing.T, topic string) (broker.Publisher, broker.Subscriber) {
			return b.clients(t, topic)
		},
		PublishRaw: func(t *testing.T, topic string, headers map[string]string, body []byte) error {
			values := make(map[string]any, len(headers))
			for k, v := range headers {
				values[k] = v
			}
			return b.publishRaw(t, topic, wireTable(values), body)
		},
		PublishRawValues: func(t *testing.T, topic string, headers map[string]any, body []byte) error {
			return b.publishRaw(t, topic, wireTable(headers), body)
		},
		Features: f,
	}
}

// wireTable is the AMQP table a foreign producer following
// docs/envelope.md publishes for these headers: the envelope's string
// fields packed into delaybridge-env; everything else, and an envelope
// field of another type (which the packed string cannot carry), as its own
// header.
func wireTable(headers map[string]any) amqp.Table {
	env := map[string]string{}
	t := table(headers)
	for k, v := range headers {
		if s, ok := v.(string); ok && strings.HasPrefix(k, wire.HeaderPrefix) {
			env[k] = s
			delete(t, k)
		}
	}
	if len(env) > 0 {
		t[envHeader] = packEnvelope(env)
	}
	return t
}

// table turns the header values brokertest sends into AMQP field values:
// nested maps become tables, the rest is sent as it is.
func table(m map[string]any) amqp.Table {
	t := amqp.Table{}
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			v = table(sub)
		}
		t[k] = v
	}
	return t
}
