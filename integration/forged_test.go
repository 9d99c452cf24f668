package integration

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/outbox"
	"github.com/delaybridge/delaybridge/rabbit"
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

// TestForged_MessagesFromWhoeverCanPublishChangeNothing publishes raw AMQP
// messages into a topic's queue, as anyone with write access to the broker
// could: a task due in an hour claimed due now, a task of another topic,
// and a due time far beyond the horizon. The database is the authority:
// nothing runs early, runs under the wrong handler or is marked dead. With
// signing keys, each is refused outright.
func TestForged_MessagesFromWhoeverCanPublishChangeNothing(t *testing.T) {
	skipIfShort(t)
	for _, signed := range []bool{false, true} {
		name := map[bool]string{false: "database authority", true: "signed envelopes"}[signed]
		t.Run(name, func(t *testing.T) {
			f := newFlow(t)
			other := f.topic + "_other"
			cfg := rabbitConfig(t)
			var pub broker.Publisher
			rp, err := rabbit.NewPublisher(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			var sub broker.Subscriber
			rs, err := rabbit.NewSubscriber(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = rs.Close(); _ = rp.Close() })
			pub, sub = rp, rs
			if signed {
				ring, err := broker.ParseKeyring("k1:" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32))))
				if err != nil {
					t.Fatal(err)
				}
				pub, sub = broker.Signed(rp, ring), broker.Verified(rs, ring)
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
			due := time.Now().Add(time.Hour)
			f.order(t, "victim", due)
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
			for f.count(t, "SELECT COUNT(*) FROM delay_task WHERE state = 'pending'") > 0 {
				time.Sleep(50 * time.Millisecond)
			}

			conn, err := amqp.Dial(cfg.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			forge := func(m *broker.Message) {
				h := amqp.Table{}
				for k, v := range broker.Encode(m) {
					h[k] = v
				}
				if err := ch.Publish("", cfg.Prefix+".q."+f.topic, false, false, amqp.Publishing{Headers: h, Body: m.Payload, DeliveryMode: amqp.Persistent}); err != nil {
					t.Fatal(err)
				}
			}
			now := broker.MillisUTC(time.Now())
			forge(&broker.Message{TaskID: victimID, Topic: f.topic, Key: "victim", DeliverAt: now})
			forge(&broker.Message{TaskID: otherID, Topic: other, Key: "bystander", DeliverAt: now})
			forge(&broker.Message{TaskID: victimID, Topic: f.topic, Key: "victim", DeliverAt: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)})

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
			for key, want := range map[string]outbox.State{"victim": outbox.StatePublished, "bystander": outbox.StatePublished} {
				var st string
				if err := f.db.QueryRow("SELECT state FROM delay_task WHERE task_key = ?", key).Scan(&st); err != nil {
					t.Fatal(err)
				}
				if outbox.State(strings.TrimSpace(st)) != want {
					t.Errorf("%s: state %s after the forged messages, want %s", key, st, want)
				}
			}
			q, err := ch.QueueDeclarePassive(cfg.Prefix+".q."+other, true, false, false, false, nil)
			if err == nil && q.Messages > 1 {
				t.Errorf("the other topic's queue holds %d messages: a forged one was re-published into it", q.Messages)
			}
		})
	}
}

// eventually waits up to 30s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
