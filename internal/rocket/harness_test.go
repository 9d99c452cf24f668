package rocket_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Local broker settings, as scripts/rocketmq/broker.conf sets them.
const (
	localTimerMaxDelay = 3600 * time.Second
	localPrecision     = 100 * time.Millisecond
	topicQueues        = 4
)

// env is what a test needs to talk to the local RocketMQ.
type env struct {
	nameServers []string
	created     sync.Map // topic -> struct{}
}

func setup(t testing.TB) *env {
	t.Helper()
	return &env{nameServers: strings.Split(testenv.RocketMQ(t), ",")}
}

// config returns a Config on the local broker with limits and no lead:
// every hop is a timer message, as the wheel's tests need. The lead's
// tests set one.
func (e *env) config(limits broker.Limits) rocket.Config {
	return rocket.Config{NameServers: e.nameServers, Limits: limits, GroupPrefix: "dbt", Lead: -1}
}

// topic creates topic once and waits for its route.
func (e *env) topic(t testing.TB, topic string) {
	t.Helper()
	if _, loaded := e.created.LoadOrStore(topic, struct{}{}); loaded {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rocket.CreateTopic(ctx, e.nameServers, testenv.RocketBrokerAddr(), topic, topicQueues); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
}

// clients returns a publisher and a subscriber for topic, closed at cleanup.
func (e *env) clients(t testing.TB, topic string, limits broker.Limits) (*rocket.Publisher, *rocket.Subscriber) {
	t.Helper()
	pub, err := rocket.NewPublisher(context.Background(), e.config(limits))
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	sub, err := rocket.NewSubscriber(e.config(limits))
	if err != nil {
		_ = pub.Close()
		t.Fatalf("NewSubscriber: %v", err)
	}
	// The topic and the group's retry topic, so a delivery given back
	// returns in about a second even in the group's first minute.
	if _, loaded := e.created.LoadOrStore(topic, struct{}{}); !loaded {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := sub.CreateTopic(ctx, testenv.RocketBrokerAddr(), topic, topicQueues)
		cancel()
		if err != nil {
			_ = pub.Close()
			_ = sub.Close()
			t.Fatalf("Subscriber.CreateTopic: %v", err)
		}
	}
	t.Cleanup(func() {
		if err := sub.Close(); err != nil {
			t.Errorf("Subscriber.Close: %v", err)
		}
		if err := pub.Close(); err != nil {
			t.Errorf("Publisher.Close: %v", err)
		}
	})
	return pub, sub
}

// publishRaw sends body with exactly these properties, as a foreign
// producer would, and returns the client's error.
func (e *env) publishRaw(t testing.TB, topic string, props map[string]string, body []byte) error {
	t.Helper()
	p, err := producer.NewDefaultProducer(
		producer.WithNameServer(e.nameServers),
		producer.WithGroupName("dbt-raw"),
		producer.WithInstanceName(testenv.Name("raw")),
		producer.WithRetry(0),
	)
	if err != nil {
		t.Fatalf("raw producer: %v", err)
	}
	if err := p.Start(); err != nil {
		t.Fatalf("raw producer start: %v", err)
	}
	defer func() { _ = p.Shutdown() }()
	msg := primitive.NewMessage(topic, body)
	for k, v := range props {
		msg.WithProperty(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = p.SendSync(ctx, msg)
	return err
}

func (e *env) harness(limits broker.Limits, late time.Duration) brokertest.Harness {
	return brokertest.Harness{
		New: func(t *testing.T, topic string) (broker.Publisher, broker.Subscriber) {
			return e.clients(t, topic, limits)
		},
		PublishRaw: func(t *testing.T, topic string, headers map[string]string, body []byte) error {
			e.topic(t, topic)
			return e.publishRaw(t, topic, headers, body)
		},
		// Properties travel as JSON between the client and the broker.
		Features: brokertest.Features{MaxHop: limits.MaxHop, LateBound: late, HeadersAlwaysUTF8: true},
	}
}

func TestAdapter_TimerMode(t *testing.T) {
	e := setup(t)
	brokertest.TestAdapter(t, e.harness(rocket.TimerLimits(2*time.Second, localPrecision), localPrecision+400*time.Millisecond))
}

func TestAdapter_LevelMode(t *testing.T) {
	e := setup(t)
	brokertest.TestAdapter(t, e.harness(rocket.LevelLimits(rocket.DefaultLevels(), 5*time.Second), rocket.LevelPrecision+400*time.Millisecond))
}
