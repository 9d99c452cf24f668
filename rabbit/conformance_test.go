package rabbit

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/brokertest"
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
			h := amqp.Table{}
			for k, v := range headers {
				h[k] = v
			}
			return b.publishRaw(t, topic, h, body)
		},
		PublishRawValues: func(t *testing.T, topic string, headers map[string]any, body []byte) error {
			return b.publishRaw(t, topic, table(headers), body)
		},
		Features: f,
	}
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
