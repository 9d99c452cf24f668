package memory_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
)

// A consumer on the in-memory broker: a message published now and due in
// 200ms reaches its handler no earlier than that, and the handler's nil
// error acks it. The same consumer runs on RabbitMQ or RocketMQ with their
// publisher and subscriber in place of the memory broker.
func Example() {
	ctx := context.Background()
	b := memory.New(memory.Config{})
	defer b.Close()

	handled := make(chan string, 1)
	consumer, err := broker.NewConsumer(b, b, func(ctx context.Context, m *broker.Message) error {
		late := !time.Now().Before(m.DeliverAt)
		handled <- fmt.Sprintf("%s/%s %s, not early: %v", m.Topic, m.Key, m.Payload, late)
		return nil
	}, broker.ConsumerConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Start(ctx, "order-cancel"); err != nil {
		log.Fatal(err)
	}
	defer consumer.Close(ctx)

	due := time.Now().Add(200 * time.Millisecond)
	msg := &broker.Message{Topic: "order-cancel", Key: "order-42", Payload: []byte("cancel"), DeliverAt: broker.MillisUTC(due)}
	if err := b.Publish(ctx, msg); err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-handled)
	// Output:
	// order-cancel/order-42 cancel, not early: true
}
