package outbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// realBroker opens a publisher and a subscriber on a real broker for topic,
// closed at cleanup.
type realBroker func(t *testing.T, topic string) (broker.Publisher, broker.Subscriber)

func rabbitBroker(t *testing.T, topic string) (broker.Publisher, broker.Subscriber) {
	url := testenv.AMQP(t)
	prefix := testenv.Name("ob")
	t.Cleanup(func() { testenv.DeleteRabbitPrefix(t, url, prefix) })
	cfg := rabbit.Config{URL: url, Prefix: prefix, Unit: 250 * time.Millisecond, Depth: 4, ConnectionName: prefix, Logger: quiet()}
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

func rocketBroker(t *testing.T, topic string) (broker.Publisher, broker.Subscriber) {
	ns := strings.Split(testenv.RocketMQ(t), ",")
	addr := testenv.RocketBrokerAddr()
	cfg := rocket.Config{NameServers: ns, Limits: rocket.TimerLimits(time.Hour, 100*time.Millisecond), GroupPrefix: "ob", Logger: quiet()}
	pub, err := rocket.NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatalf("rocket.NewPublisher: %v", err)
	}
	sub, err := rocket.NewSubscriber(cfg)
	if err != nil {
		_ = pub.Close()
		t.Fatalf("rocket.NewSubscriber: %v", err)
	}
	t.Cleanup(func() { _ = sub.Close(); _ = pub.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sub.CreateTopic(ctx, addr, topic, 2); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	return pub, sub
}

// TestRoundTrip_MetacharactersAndLargestPayloadsArriveUnharmed schedules
// tasks full of SQL metacharacters, and payloads at exactly the default
// limit and at MaxPayloadCeiling, then relays them through each real broker
// to a handler running under Handle: each arrives byte for byte as
// scheduled and is done once.
func TestRoundTrip_MetacharactersAndLargestPayloadsArriveUnharmed(t *testing.T) {
	for name, open := range map[string]realBroker{"rabbit": rabbitBroker, "rocket": rocketBroker} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			topic := "Meta_" + strings.ReplaceAll(testenv.Name("rt"), "_", "-")
			pub, sub := open(t, topic)

			now := time.Now()
			tasks := []outbox.Task{
				{
					Topic: topic, Key: "o'1\"; DROP TABLE delay_task; -- \\ % _ \x00 订单", DueAt: now,
					Payload: []byte("'\x00\"\\%_\n\r\x1a; DROP TABLE delay_task; --"),
					Headers: map[string]string{"q'uote": `"\`, "pct%_": "_%\x00", "sql": "'); DELETE FROM delay_task; --", "<html>": "&amp;"},
					Trace:   `00-'"\%_-01`,
				},
				// LIKE wildcards and an escape character as whole keys: each
				// is its own task, matched by no other.
				{Topic: topic, Key: "%", DueAt: now, Payload: []byte("percent")},
				{Topic: topic, Key: "_", DueAt: now, Payload: []byte("underscore")},
				{Topic: topic, Key: `\`, DueAt: now, Payload: []byte("backslash")},
				{Topic: topic, Key: "limit", DueAt: now, Payload: random(t, outbox.DefaultMaxPayload)},
			}
			for _, task := range tasks {
				b.schedule(t, task)
			}
			// The largest payload any configuration allows.
			ceiling := outbox.Task{Topic: topic, Key: "ceiling", DueAt: now, Payload: random(t, outbox.MaxPayloadCeiling)}
			if _, err := outbox.New(outbox.Config{MaxPayload: 1 << 30}).Schedule(b.ctx, b.db, ceiling); err != nil {
				t.Fatalf("Schedule at MaxPayloadCeiling: %v", err)
			}
			tasks = append(tasks, ceiling)

			var mu sync.Mutex
			seen := map[string][]*broker.Message{}
			h := outbox.BrokerHandler(b.db, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
				mu.Lock()
				seen[m.Key] = append(seen[m.Key], m)
				mu.Unlock()
				return nil
			})
			c, err := broker.NewConsumer(sub, pub, h, broker.ConsumerConfig{Logger: quiet(), DeadLetter: outbox.DeadLetter(b.db, nil)})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(b.ctx, topic); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = c.Close(ctx)
			})
			relay, err := outbox.NewRelay(b.db, pub, outbox.RelayConfig{Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			ctx, stop := context.WithCancel(b.ctx)
			done := make(chan error, 1)
			go func() { done <- relay.Run(ctx) }()
			t.Cleanup(func() { stop(); <-done })

			if !testutil.Eventually(60*time.Second, 50*time.Millisecond, func() bool { return b.count(t, "state = 'done'") >= len(tasks) }) {
				var states []string
				rows, _ := b.db.Query("SELECT CONCAT(HEX(task_key), ':', state, ':', COALESCE(last_error, '')) FROM delay_task")
				for rows != nil && rows.Next() {
					var s string
					_ = rows.Scan(&s)
					states = append(states, s)
				}
				t.Fatalf("not every task done after 60s: %v", states)
			}

			mu.Lock()
			defer mu.Unlock()
			for _, task := range tasks {
				got := seen[task.Key]
				if len(got) != 1 {
					t.Errorf("key %q handled %d times, want once", task.Key, len(got))
					continue
				}
				m := got[0]
				if m.Topic != task.Topic || !bytes.Equal(m.Payload, task.Payload) || m.Trace != task.Trace || !maps.Equal(m.Headers, task.Headers) {
					t.Errorf("key %q changed on the way: topic %q, payload %d bytes (want %d, equal %v), trace %q, headers %q",
						task.Key, m.Topic, len(m.Payload), len(task.Payload), bytes.Equal(m.Payload, task.Payload), m.Trace, m.Headers)
				}
			}
			if n := b.count(t, "1=1"); n != len(tasks) {
				t.Fatalf("delay_task holds %d rows, want %d", n, len(tasks))
			}
		})
	}
}

// random returns n random bytes: incompressible, so a broker that
// compresses bodies gets no help.
func random(t *testing.T, n int) []byte {
	p := make([]byte, n)
	if _, err := rand.Read(p); err != nil {
		t.Fatal(err)
	}
	return p
}
