package rocket

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// CreateTopic creates topic (or updates it to queues read and write queues)
// on the broker at brokerAddr and waits until the name servers route it to
// that broker, so a consumer started next finds its queues there at once.
// With several broker groups, create it on each master in turn. Topics a broker auto-creates on
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
// name servers of cfg route it there.
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
		routed, err := routedOn(ctx, cfg, brokerAddr, name)
		if err == nil && routed {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rocket: topic %s created on %s but not routed there by the name servers: %w (last: %v)", name, brokerAddr, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// routedOn reports whether every name server of cfg that answers routes
// topic to queues on brokerAddr, read afresh (the client library caches
// routes). With several broker groups, a topic already routed to another
// group is not enough: a consumer started then would take only that
// group's queues until its route refresh, 30 s later. A brokerAddr the name
// servers know under another address (a host name for their IP) cannot be
// matched; then any route of topic counts, as it did before several groups
// were considered.
func routedOn(ctx context.Context, cfg Config, brokerAddr, topic string) (bool, error) {
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = DefaultSendTimeout // bounds each request
	}
	answered := 0
	var last error
	for _, ns := range cfg.NameServers {
		masters, err := routedMasters(ctx, cfg, ns, topic)
		if err != nil {
			last = err
			continue
		}
		answered++
		switch {
		case masters[brokerAddr]:
		case len(masters) == 0:
			return false, nil
		default:
			known, err := brokerMasters(ctx, cfg, ns)
			if err != nil {
				return false, err
			}
			for _, addr := range known {
				if addr == brokerAddr {
					return false, nil
				}
			}
		}
	}
	if answered == 0 {
		return false, last
	}
	return true, nil
}
