package integration

// Smoke tests of the local environment: each service does the one thing
// delaybridge relies on it for. `make demo` runs these for now.

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	amqp "github.com/rabbitmq/amqp091-go"
)

func TestEnvironment_MariaDBWritesAndReadsARow(t *testing.T) {
	db := requireMySQL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	table := uniqueName("env_check")
	_, err := db.ExecContext(ctx, fmt.Sprintf(
		"CREATE TABLE `%s` (id BIGINT PRIMARY KEY, note VARCHAR(64) NOT NULL, at DATETIME(3) NOT NULL) ENGINE=InnoDB", table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, err := db.Exec(fmt.Sprintf("DROP TABLE IF EXISTS `%s`", table))
		if err != nil {
			t.Fatal(err)
		}
	})

	at := time.Now().UTC().Truncate(time.Millisecond)
	_, err = db.ExecContext(ctx, fmt.Sprintf("INSERT INTO `%s` (id, note, at) VALUES (?, ?, ?)", table), 42, "cancel order 42 ✓", at)
	if err != nil {
		t.Fatal(err)
	}

	var note string
	var got time.Time
	err = db.QueryRowContext(ctx, fmt.Sprintf("SELECT note, at FROM `%s` WHERE id = ?", table), 42).Scan(&note, &got)
	if err != nil {
		t.Fatal(err)
	}
	if note != "cancel order 42 ✓" {
		t.Fatalf("utf8mb4 text survives the round trip: got %v, want %v", note, "cancel order 42 ✓")
	}
	if !at.Equal(got) {
		t.Fatalf("DATETIME(3) round trip: wrote %v, read %v", at, got)
	}
}

func TestEnvironment_RabbitMQConfirmedPublishIsConsumed(t *testing.T) {
	conn := requireAMQP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ch.Close() }()

	// Quorum queues are always durable and can be neither exclusive nor
	// auto-delete, so the test deletes it itself, on a channel of its own.
	queue := uniqueName("env_check")
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cleanup, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cleanup.Close() }()
		_, err = cleanup.QueueDelete(queue, false, false, false)
		if err != nil {
			t.Fatal(err)
		}
	})

	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	body := []byte("cancel order 42 at " + time.Now().UTC().Format(time.RFC3339Nano))
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		ContentType:  "text/plain",
		Body:         body,
	})
	if err != nil {
		t.Fatal(err)
	}
	acked, err := confirm.WaitContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !acked {
		t.Fatalf("broker nacked the publish")
	}

	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d, ok := <-deliveries:
		if !ok {
			t.Fatalf("delivery channel closed")
		}
		if got, want := d.Body, body; !bytes.Equal(got, want) {
			t.Fatalf("got %v, want %v", got, want)
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("confirmed message was not delivered within 30s")
	}
}

func TestEnvironment_RocketMQTimerMessageArrivesNoEarlierThanDue(t *testing.T) {
	namesrv := requireRocketMQ(t)
	resolver := primitive.NewPassthroughResolver([]string{namesrv})
	topic := uniqueName("env_check")

	prod, err := producer.NewDefaultProducer(
		producer.WithNsResolver(resolver),
		producer.WithGroupName(topic+"_producer"),
		producer.WithInstanceName(topic+"_producer"),
		producer.WithRetry(2),
		producer.WithSendMsgTimeout(10*time.Second),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := prod.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = prod.Shutdown() }()

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// A plain marker first: sending it creates the topic (autoCreateTopicEnable),
	// and once the consumer has received it, the consumer owns its queues, so
	// the timer message below cannot be missed or sit behind a rebalance.
	_, err = prod.SendSync(ctx, primitive.NewMessage(topic, []byte("marker")))
	if err != nil {
		t.Fatal(err)
	}

	type arrival struct {
		body string
		at   time.Time
	}
	arrivals := make(chan arrival, 16)
	cons, err := consumer.NewPushConsumer(
		consumer.WithNsResolver(resolver),
		consumer.WithGroupName(topic+"_consumer"),
		consumer.WithInstance(topic+"_consumer"),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
	)
	if err != nil {
		t.Fatal(err)
	}
	err = cons.Subscribe(topic, consumer.MessageSelector{Type: consumer.TAG, Expression: "*"},
		func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			now := time.Now()
			for _, m := range msgs {
				arrivals <- arrival{body: string(m.Body), at: now}
			}
			return consumer.ConsumeSuccess, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if err := cons.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cons.Shutdown() }()

	select {
	case a := <-arrivals:
		if got := a.body; got != "marker" {
			t.Fatalf("got %v, want %v", got, "marker")
		}
	case <-ctx.Done():
		t.Fatal("consumer did not receive the marker within 90s: no queues assigned?")
	}

	// The broker's timer wheel (timerPrecisionMs=100 in scripts/rocketmq/broker.conf)
	// delivers at the first slot boundary at or after the due time.
	due := time.Now().Add(2 * time.Second)
	msg := primitive.NewMessage(topic, []byte("timer")).WithDelayTimestamp(due)
	if got, want := msg.GetProperty(primitive.PropertyTimerDeliverMS), fmt.Sprint(due.UnixMilli()); got != want {
		t.Fatalf("got %v, want %v", got, want)
	}
	res, err := prod.SendSync(ctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Status; got != primitive.SendOK {
		t.Fatalf("got %v, want %v", got, primitive.SendOK)
	}

	select {
	case a := <-arrivals:
		if got := a.body; got != "timer" {
			t.Fatalf("got %v, want %v", got, "timer")
		}
		if a.at.Before(due) {
			t.Fatalf("timer message arrived %v before its due time", due.Sub(a.at))
		}
		if late := a.at.Sub(due); late > 10*time.Second {
			t.Fatalf("timer message arrived %v late", late)
		}
		t.Logf("timer message due %s arrived %v after due", due.Format("15:04:05.000"), a.at.Sub(due))
	case <-time.After(time.Until(due) + 10*time.Second):
		t.Fatal("timer message did not arrive within 10s of its due time")
	}
}
