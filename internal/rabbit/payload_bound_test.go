package rabbit

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// queueExists reports whether queue is declared on the broker.
func (b *bundle) queueExists(t *testing.T, queue string) bool {
	t.Helper()
	_, err := b.channel(t).QueueDeclarePassive(queue, true, false, false, false, nil)
	var aerr *amqp.Error
	if err != nil && (!errors.As(err, &aerr) || aerr.Code != amqp.NotFound) {
		t.Fatalf("passive declare of %s: %v", queue, err)
	}
	return err == nil
}

// A message with a payload larger than any subscriber accepts is refused
// for good before anything is declared or sent: published, every consumer
// would refuse it as malformed and the scanner would publish it again for
// ever.
func TestPublisher_RefusesAPayloadNoSubscriberAccepts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := "huge"
	pub, _ := b.clients(t, topic)
	err := pub.Publish(context.Background(),
		&broker.Message{Topic: topic, Key: "too-big", DeliverAt: time.Now(), Payload: bytes.Repeat([]byte{'x'}, broker.MaxBody+1)},
		&broker.Message{Topic: "fits", Key: "at-the-bound", DeliverAt: time.Now(), Payload: bytes.Repeat([]byte{'x'}, broker.MaxBody)})
	b.topic("fits")
	res := broker.PublishResults(err, 2)
	if !errors.Is(res[0], broker.ErrRejected) || !strings.Contains(res[0].Error(), "payload of 4194305 bytes") {
		t.Fatalf("oversize publish: %v; want ErrRejected naming the size", res[0])
	}
	if res[1] != nil {
		t.Fatalf("a payload of exactly broker.MaxBody: %v; want it published", res[1])
	}
	if b.queueExists(t, topology{cfg: b.cfg}.topicQueue(topic)) {
		t.Fatal("the refused message's topic got a queue")
	}
}
