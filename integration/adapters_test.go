package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// adapter opens one real broker for the flow tests.
type adapter struct {
	name string
	// open returns a publisher and a subscriber for topic, closed at
	// cleanup. Every call in one test shares the broker-side topology.
	open func(t testing.TB, topic string) (broker.Publisher, broker.Subscriber)
	// lose destroys every copy the broker holds of topic's messages. No
	// consumer of topic may run while it does.
	lose func(t testing.TB, topic string)
}

// Small hop limits so the flows exercise hops within seconds.
const (
	rabbitUnit  = 100 * time.Millisecond
	rabbitDepth = 5 // one hop covers 3.1s
	rocketHop   = 2 * time.Second
	rocketPrec  = 100 * time.Millisecond
)

// eachAdapter runs f as a parallel subtest per broker, each set up anew.
func eachAdapter(t *testing.T, f func(t *testing.T, ad adapter)) {
	for _, a := range []struct {
		name string
		mk   func(testing.TB) adapter
	}{{"rabbit", rabbitAdapter}, {"rocket", rocketAdapter}} {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			f(t, a.mk(t))
		})
	}
}

func rabbitAdapter(t testing.TB) adapter {
	cfg := rabbitConfig(t)
	return adapter{
		name: "rabbit",
		open: func(t testing.TB, topic string) (broker.Publisher, broker.Subscriber) {
			return rabbitClients(t, cfg)
		},
		lose: func(t testing.TB, topic string) {
			conn, err := amqp.Dial(cfg.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			// The ladder's queue names: <prefix>.delay.<level> and the topic's
			// consumer queue <prefix>.q.<topic> (internal/rabbit/ladder.go).
			lost := 0
			for _, q := range append(ladderQueues(cfg), cfg.Prefix+".q."+topic) {
				n, err := ch.QueuePurge(q, false)
				if err != nil {
					t.Fatalf("purge %s: %v", q, err)
				}
				lost += n
			}
			t.Logf("purged %d messages from the ladder and the consumer queue", lost)
		},
	}
}

// rabbitClients opens a publisher and a subscriber on cfg, closed at
// cleanup.
func rabbitClients(t testing.TB, cfg rabbit.Config) (*rabbit.Publisher, *rabbit.Subscriber) {
	t.Helper()
	pub, err := rabbit.NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatalf("rabbit.NewPublisher: %v", err)
	}
	sub, err := rabbit.NewSubscriber(cfg)
	if err != nil {
		_ = pub.Close()
		t.Fatalf("rabbit.NewSubscriber: %v", err)
	}
	t.Cleanup(func() { _ = sub.Close(); _ = pub.Close() })
	return pub, sub
}

func ladderQueues(cfg rabbit.Config) []string {
	var qs []string
	for k := range cfg.Depth {
		qs = append(qs, fmt.Sprintf("%s.delay.%d", cfg.Prefix, k))
	}
	return qs
}

// rabbitConfig returns a ladder under a fresh prefix, deleted when the
// test ends.
func rabbitConfig(t testing.TB) rabbit.Config {
	t.Helper()
	url := testenv.AMQP(t)
	prefix := testenv.Name("it")
	cfg := rabbit.Config{URL: url, Prefix: prefix, Unit: rabbitUnit, Depth: rabbitDepth, ConnectionName: prefix}
	t.Cleanup(func() { testenv.DeleteRabbitPrefix(t, url, prefix) })
	return cfg
}

func rocketAdapter(t testing.TB) adapter {
	brokerAddr := testenv.RocketBrokerAddr()
	return adapter{
		name: "rocket",
		open: func(t testing.TB, topic string) (broker.Publisher, broker.Subscriber) {
			ns := strings.Split(testenv.RocketMQ(t), ",")
			createRocketTopic(t, ns, brokerAddr, topic)
			cfg := rocket.Config{NameServers: ns, Limits: rocket.TimerLimits(rocketHop, rocketPrec), GroupPrefix: "it"}
			pub, err := rocket.NewPublisher(context.Background(), cfg)
			if err != nil {
				t.Fatalf("rocket.NewPublisher: %v", err)
			}
			sub, err := rocket.NewSubscriber(cfg)
			if err != nil {
				t.Fatalf("rocket.NewSubscriber: %v", err)
			}
			t.Cleanup(func() { _ = sub.Close(); _ = pub.Close() })
			return pub, sub
		},
		lose: func(t testing.TB, topic string) {
			// Timer messages still in the broker's wheel would be written to
			// the topic when due, so the caller waits until they are due;
			// deleting the topic then drops every copy.
			testenv.MQAdmin(t, "deleteTopic", "-t", topic, "-c", "DefaultCluster")
			ns := strings.Split(testenv.RocketMQ(t), ",")
			createRocketTopic(t, ns, brokerAddr, topic)
		},
	}
}

func createRocketTopic(t testing.TB, ns []string, brokerAddr, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rocket.CreateTopic(ctx, ns, brokerAddr, topic, 4); err != nil {
		t.Fatalf("CreateTopic %s: %v", topic, err)
	}
}
