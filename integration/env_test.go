package integration

// Smoke tests of the local environment: each service does the one thing
// delaybridge relies on it for. `make demo` runs these for now.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

func TestEnvironment_MariaDBWritesAndReadsARow(t *testing.T) {
	db := requireMySQL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	table := uniqueName("env_check")
	_, err := db.ExecContext(ctx, fmt.Sprintf(
		"CREATE TABLE `%s` (id BIGINT PRIMARY KEY, note VARCHAR(64) NOT NULL, at DATETIME(3) NOT NULL) ENGINE=InnoDB", table))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.Exec(fmt.Sprintf("DROP TABLE IF EXISTS `%s`", table))
		require.NoError(t, err)
	})

	at := time.Now().UTC().Truncate(time.Millisecond)
	_, err = db.ExecContext(ctx, fmt.Sprintf("INSERT INTO `%s` (id, note, at) VALUES (?, ?, ?)", table), 42, "cancel order 42 ✓", at)
	require.NoError(t, err)

	var note string
	var got time.Time
	err = db.QueryRowContext(ctx, fmt.Sprintf("SELECT note, at FROM `%s` WHERE id = ?", table), 42).Scan(&note, &got)
	require.NoError(t, err)
	require.Equal(t, "cancel order 42 ✓", note, "utf8mb4 text survives the round trip")
	require.True(t, at.Equal(got), "DATETIME(3) round trip: wrote %v, read %v", at, got)
}

func TestEnvironment_RabbitMQConfirmedPublishIsConsumed(t *testing.T) {
	conn := requireAMQP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ch, err := conn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()

	// Quorum queues are always durable and can be neither exclusive nor
	// auto-delete, so the test deletes it itself, on a channel of its own.
	queue := uniqueName("env_check")
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	t.Cleanup(func() {
		cleanup, err := conn.Channel()
		require.NoError(t, err)
		defer func() { _ = cleanup.Close() }()
		_, err = cleanup.QueueDelete(queue, false, false, false)
		require.NoError(t, err)
	})

	require.NoError(t, ch.Confirm(false))
	body := []byte("cancel order 42 at " + time.Now().UTC().Format(time.RFC3339Nano))
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		ContentType:  "text/plain",
		Body:         body,
	})
	require.NoError(t, err)
	acked, err := confirm.WaitContext(ctx)
	require.NoError(t, err)
	require.True(t, acked, "broker nacked the publish")

	require.NoError(t, ch.Qos(1, 0, false))
	deliveries, err := ch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	require.NoError(t, err)
	select {
	case d, ok := <-deliveries:
		require.True(t, ok, "delivery channel closed")
		require.Equal(t, body, d.Body)
		require.NoError(t, d.Ack(false))
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
	require.NoError(t, err)
	require.NoError(t, prod.Start())
	defer func() { _ = prod.Shutdown() }()

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// A plain marker first: sending it creates the topic (autoCreateTopicEnable),
	// and once the consumer has received it, the consumer owns its queues, so
	// the timer message below cannot be missed or sit behind a rebalance.
	_, err = prod.SendSync(ctx, primitive.NewMessage(topic, []byte("marker")))
	require.NoError(t, err)

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
	require.NoError(t, err)
	err = cons.Subscribe(topic, consumer.MessageSelector{Type: consumer.TAG, Expression: "*"},
		func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			now := time.Now()
			for _, m := range msgs {
				arrivals <- arrival{body: string(m.Body), at: now}
			}
			return consumer.ConsumeSuccess, nil
		})
	require.NoError(t, err)
	require.NoError(t, cons.Start())
	defer func() { _ = cons.Shutdown() }()

	select {
	case a := <-arrivals:
		require.Equal(t, "marker", a.body)
	case <-ctx.Done():
		t.Fatal("consumer did not receive the marker within 90s: no queues assigned?")
	}

	// The broker's timer wheel (timerPrecisionMs=100 in scripts/rocketmq/broker.conf)
	// delivers at the first slot boundary at or after the due time.
	due := time.Now().Add(2 * time.Second)
	msg := primitive.NewMessage(topic, []byte("timer")).WithDelayTimestamp(due)
	require.Equal(t, fmt.Sprint(due.UnixMilli()), msg.GetProperty(primitive.PropertyTimerDeliverMS))
	res, err := prod.SendSync(ctx, msg)
	require.NoError(t, err)
	require.Equal(t, primitive.SendOK, res.Status)

	select {
	case a := <-arrivals:
		require.Equal(t, "timer", a.body)
		require.False(t, a.at.Before(due), "timer message arrived %v before its due time", due.Sub(a.at))
		require.WithinDuration(t, due, a.at, 10*time.Second, "timer message arrived late")
		t.Logf("timer message due %s arrived %v after due", due.Format("15:04:05.000"), a.at.Sub(due))
	case <-time.After(time.Until(due) + 10*time.Second):
		t.Fatal("timer message did not arrive within 10s of its due time")
	}
}
