package rocket

import (
	"context"
	"fmt"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/delaybridge/delaybridge/broker"
)

// CreateTopic creates topic (or updates it to queues read and write queues)
// on the broker at brokerAddr and waits until the name servers route it, so
// a consumer started next finds it at once. Topics a broker auto-creates on
// first send reach the name servers only later, and a push consumer refuses
// to start on a topic without a route.
func CreateTopic(ctx context.Context, nameServers []string, brokerAddr, topic string, queues int) error {
	if err := broker.ValidateTopic(topic); err != nil {
		return err
	}
	installClientLog()
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(nameServers)))
	if err != nil {
		return fmt.Errorf("rocket: admin client: %w", err)
	}
	defer adm.Close()
	if err := adm.CreateTopic(ctx,
		admin.WithTopicCreate(topic),
		admin.WithBrokerAddrCreate(brokerAddr),
		admin.WithReadQueueNums(queues),
		admin.WithWriteQueueNums(queues),
	); err != nil {
		return fmt.Errorf("rocket: create topic %s on %s: %w", topic, brokerAddr, err)
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		mqs, err := adm.FetchPublishMessageQueues(ctx, topic)
		if err == nil && len(mqs) > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rocket: topic %s created on %s but not routed by the name servers: %w (last: %v)", topic, brokerAddr, ctx.Err(), err)
		case <-tick.C:
		}
	}
}
