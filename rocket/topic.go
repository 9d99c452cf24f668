package rocket

import (
	"context"
	"errors"
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
	return createRouted(ctx, Config{NameServers: nameServers}, brokerAddr, topic, queues)
}

// CreateTopic creates topic as the package's CreateTopic does, with the
// Publisher's ACL credentials and TLS setting.
func (p *Publisher) CreateTopic(ctx context.Context, brokerAddr, topic string, queues int) error {
	if err := broker.ValidateTopic(topic); err != nil {
		return err
	}
	return createRouted(ctx, p.cfg, brokerAddr, topic, queues)
}

// CreateTopic creates topic as the package's CreateTopic does and, with it,
// the retry topic of the consumer group this Subscriber consumes topic in.
// A consumer of a group whose retry topic exists when it starts gets a
// delivery it gave back (Nack, or unsettled at close) again after about a
// second; otherwise only after its first route refresh, 30 to 40 seconds
// (see Subscriber).
func (s *Subscriber) CreateTopic(ctx context.Context, brokerAddr, topic string, queues int) error {
	if err := broker.ValidateTopic(topic); err != nil {
		return err
	}
	if err := createRouted(ctx, s.cfg, brokerAddr, topic, queues); err != nil {
		return err
	}
	// One queue, as the broker gives a retry topic it creates itself.
	if err := createRouted(ctx, s.cfg, brokerAddr, retryTopicPrefix+s.Group(topic), 1); err != nil {
		return err
	}
	s.retryRouted.Store(topic, struct{}{})
	return nil
}

// ErrCreateTopicWithACL reports a topic creation asked of a client with
// ACL credentials. rocketmq-client-go's admin client sends CreateTopic to
// the broker without the ACL signature, so an ACL broker would refuse it;
// on such a cluster topics are created by an administrator (mqadmin
// updateTopic) before delaybridge uses them.
var ErrCreateTopicWithACL = errors.New("rocket: cannot create topics with ACL credentials (rocketmq-client-go does not sign admin requests); create them with mqadmin updateTopic")

// retryTopicPrefix starts the name of a consumer group's retry topic.
const retryTopicPrefix = "%RETRY%"

// createRouted creates or updates name on brokerAddr and waits until the
// name servers of cfg route it.
func createRouted(ctx context.Context, cfg Config, brokerAddr, name string, queues int) error {
	if !cfg.credentials().IsEmpty() {
		return fmt.Errorf("%w: topic %s", ErrCreateTopicWithACL, name)
	}
	installClientLog()
	adm, err := admin.NewAdmin(append(clientOptions(cfg, admin.WithCredentials, admin.WithTls), admin.WithResolver(primitive.NewPassthroughResolver(cfg.NameServers)))...)
	if err != nil {
		return fmt.Errorf("rocket: admin client: %w", err)
	}
	defer adm.Close()
	if err := adm.CreateTopic(ctx,
		admin.WithTopicCreate(name),
		admin.WithBrokerAddrCreate(brokerAddr),
		admin.WithReadQueueNums(queues),
		admin.WithWriteQueueNums(queues),
	); err != nil {
		return fmt.Errorf("rocket: create topic %s on %s: %w", name, brokerAddr, err)
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		mqs, err := adm.FetchPublishMessageQueues(ctx, name)
		if err == nil && len(mqs) > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rocket: topic %s created on %s but not routed by the name servers: %w (last: %v)", name, brokerAddr, ctx.Err(), err)
		case <-tick.C:
		}
	}
}
