package integration

import (
	"context"
	"encoding/base64"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
	"github.com/delaybridge/delaybridge/internal/wire"
)

// reasons records why deliveries went dead.
type reasons struct {
	mu  sync.Mutex
	got []error
}

func (r *reasons) Dead(_ context.Context, _ *broker.Delivery, reason error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, reason)
	return nil
}

func (r *reasons) count(target error) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.got {
		if errors.Is(e, target) {
			n++
		}
	}
	return n
}

// forgeTarget is one broker under attack: its publisher and subscriber for
// the victim topic, and a way to put a raw message into that topic's
// queue as anyone with write access to the broker could.
type forgeTarget struct {
	pub   broker.Publisher
	sub   broker.Subscriber
	forge func(m *broker.Message)
	// copiesIn counts the messages waiting in a topic's queue, where the
	// broker can tell (RabbitMQ); -1 where it cannot.
	copiesIn func(topic string) int
}

func rabbitForgeTarget(t *testing.T, victim string) forgeTarget {
	cfg := rabbitConfig(t)
	pub, sub := rabbitClients(t, cfg)
	conn, err := amqp.Dial(cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return forgeTarget{pub: pub, sub: sub,
		forge: func(m *broker.Message) {
			// The envelope as docs/envelope.md tells a foreign producer
			// to write it: one header, the fields as a URL query.
			env := url.Values{}
			for k, v := range broker.Encode(m) {
				env.Set(strings.TrimPrefix(k, wire.HeaderPrefix), v)
			}
			h := amqp.Table{"delaybridge-env": env.Encode()}
			if err := ch.Publish("", cfg.Prefix+".q."+victim, false, false, amqp.Publishing{Headers: h, Body: m.Payload, DeliveryMode: amqp.Persistent}); err != nil {
				t.Fatal(err)
			}
		},
		copiesIn: func(topic string) int {
			q, err := ch.QueueDeclarePassive(cfg.Prefix+".q."+topic, true, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			return q.Messages
		},
	}
}

func rocketForgeTarget(t *testing.T, victim string) forgeTarget {
	requireRocketMQ(t)
	ns := strings.Split(testenv.RocketMQ(t), ",")
	createRocketTopic(t, ns, testenv.RocketBrokerAddr(), victim+"_other")
	pub, sub := rocketAdapter(t).open(t, victim)
	prod, err := producer.NewDefaultProducer(producer.WithNsResolver(primitive.NewPassthroughResolver(ns)),
		producer.WithGroupName(victim+"_forger"), producer.WithInstanceName(victim+"_forger"), producer.WithSendMsgTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := prod.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prod.Shutdown() })
	return forgeTarget{pub: pub, sub: sub,
		forge: func(m *broker.Message) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			raw := primitive.NewMessage(victim, m.Payload)
			raw.WithProperties(broker.Encode(m))
			if _, err := prod.SendSync(ctx, raw); err != nil {
				t.Fatal(err)
			}
		},
		copiesIn: func(string) int { return -1 },
	}
}

// TestForged_MessagesFromWhoeverCanPublishChangeNothing publishes raw
// messages into a topic's queue, as anyone with write access to the broker
// could: a task due in an hour claimed due now, a task of another topic,
// and a due time far beyond MaxDelay. The database is the authority:
// nothing runs early, runs under the wrong handler or is marked dead. With
// signing keys, each is refused outright.
func TestForged_MessagesFromWhoeverCanPublishChangeNothing(t *testing.T) {
	skipIfShort(t)
	for _, target := range []struct {
		name string
		open func(t *testing.T, victim string) forgeTarget
	}{{"rabbit", rabbitForgeTarget}, {"rocket", rocketForgeTarget}} {
		for _, signed := range []bool{false, true} {
			name := target.name + "/" + map[bool]string{false: "database authority", true: "signed envelopes"}[signed]
			t.Run(name, func(t *testing.T) { forgeAndCheck(t, target.open, signed) })
		}
	}
}

func forgeAndCheck(t *testing.T, open func(t *testing.T, victim string) forgeTarget, signed bool) {
	f := newFlow(t)
	other := f.topic + "_other"
	tg := open(t, f.topic)
	pub, sub := tg.pub, tg.sub
	if signed {
		ring, err := broker.ParseKeyring("k1:" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32))))
		if err != nil {
			t.Fatal(err)
		}
		pub, sub = broker.Signed(pub, ring), broker.Verified(sub, ring)
	}
	dead := &reasons{}
	c, err := broker.NewConsumer(sub, pub, f.handler(t), broker.ConsumerConfig{Logger: quiet(), DeadLetter: outbox.DeadLetter(f.db, dead)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(f.ctx, f.topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	f.relay(t, pub)
	f.order(t, "victim", time.Now().Add(time.Hour))
	tx, err := f.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	otherID, err := outbox.Schedule(f.ctx, tx, outbox.Task{Topic: other, Key: "bystander", DueAt: time.Now()})
	if err != nil || tx.Commit() != nil {
		t.Fatalf("schedule the other topic's task: %v", err)
	}
	var victimID int64
	if err := f.db.QueryRow("SELECT id FROM delay_task WHERE task_key = 'victim'").Scan(&victimID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the relay to publish both tasks", func() bool {
		return f.count(t, "SELECT COUNT(*) FROM delay_task WHERE state = 'pending'") == 0
	})

	now := broker.MillisUTC(time.Now())
	body := []byte("forged")
	tg.forge(&broker.Message{TaskID: victimID, Topic: f.topic, Key: "victim", DeliverAt: now, Payload: body})
	tg.forge(&broker.Message{TaskID: otherID, Topic: other, Key: "bystander", DeliverAt: now, Payload: body})
	tg.forge(&broker.Message{TaskID: victimID, Topic: f.topic, Key: "victim", DeliverAt: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), Payload: body})

	if signed {
		eventually(t, "three forged deliveries refused", func() bool { return dead.count(broker.ErrForged) == 3 })
	} else {
		eventually(t, "the wrong-topic and too-far deliveries refused", func() bool {
			return dead.count(broker.ErrWrongTopic) == 1 && dead.count(broker.ErrTooFar) == 1
		})
		time.Sleep(2 * time.Second) // the early one: waits, or hops towards its real due time
	}
	if f.runs.Load() != 0 {
		t.Fatalf("a handler ran %d times for forged messages", f.runs.Load())
	}
	for _, key := range []string{"victim", "bystander"} {
		var st string
		if err := f.db.QueryRow("SELECT state FROM delay_task WHERE task_key = ?", key).Scan(&st); err != nil {
			t.Fatal(err)
		}
		if outbox.State(strings.TrimSpace(st)) != outbox.StatePublished {
			t.Errorf("%s: state %s after the forged messages, want published", key, st)
		}
	}
	if n := tg.copiesIn(other); n > 1 {
		t.Errorf("the other topic's queue holds %d messages: a forged one was re-published into it", n)
	}
}

// eventually waits up to 30s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !testutil.Eventually(30*time.Second, 50*time.Millisecond, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}
