package rocket_test

import (
	"context"
	"log"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rocket"
)

// A RocketMQ 5 broker: NewPublisher reads its timerMaxDelaySec and
// timerPrecisionMs, so with the defaults (259200 s, 1000 ms) a task due in
// five days takes two hops.
func Example_timerMode() {
	ctx := context.Background()
	cfg := rocket.Config{
		NameServers: []string{"127.0.0.1:9876"},
	}
	pub, err := rocket.NewPublisher(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	sub, err := rocket.NewSubscriber(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	// The topic, and the retry topic of the subscriber's consumer group.
	if err := sub.CreateTopic(ctx, "127.0.0.1:10911", "order-timeout", 8); err != nil {
		log.Fatal(err)
	}

	c, err := broker.NewConsumer(sub, pub, func(ctx context.Context, m *broker.Message) error {
		log.Printf("cancel order %s", m.Key)
		return nil
	}, broker.ConsumerConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Start(ctx, "order-timeout"); err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)

	err = pub.Publish(ctx, &broker.Message{Topic: "order-timeout", Key: "42", DeliverAt: broker.MillisUTC(time.Now().Add(5 * 24 * time.Hour))})
	if err != nil {
		log.Fatal(err)
	}
}

// A RocketMQ 4.x broker with the default delay levels: hops of at most two
// hours, each the largest level that fits.
func Example_levelMode() {
	cfg := rocket.Config{
		NameServers: []string{"127.0.0.1:9876"},
		Limits:      rocket.LevelLimits(rocket.DefaultLevels(), 0),
	}
	pub, err := rocket.NewPublisher(context.Background(), cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	hop := pub.Limits().Plan(time.Now(), time.Now().Add(25*time.Minute))
	log.Printf("first hop: level %d (%v)", hop.Level, hop.Delay)
}
