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
	brokertest.TestAdapter(t, brokertest.Harness{
		New: func(t *testing.T, topic string) (broker.Publisher, broker.Subscriber) {
			return b.clients(t, topic)
		},
		PublishRaw: func(t *testing.T, topic string, headers map[string]string, body []byte) {
			b.topic(topic)
			ch := b.channel(t)
			if err := ch.Confirm(false); err != nil {
				t.Fatalf("confirm: %v", err)
			}
			h := amqp.Table{}
			for k, v := range headers {
				h[k] = v
			}
			dc, err := ch.PublishWithDeferredConfirm("", topology{cfg: b.cfg}.topicQueue(topic), true, false, amqp.Publishing{Headers: h, Body: body, DeliveryMode: amqp.Persistent})
			if err != nil {
				t.Fatalf("publish raw: %v", err)
			}
			if !dc.Wait() {
				t.Fatal("publish raw: nacked")
			}
		},
		Features: brokertest.Features{
			MaxHop:    LadderMaxHop(testUnit, testDepth),
			LateBound: time.Second,
		},
	})
}
