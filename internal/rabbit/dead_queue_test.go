package rabbit

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// The dead queue is declared bounded, dropping its oldest copies at the
// bound rather than refusing new ones: each is a copy of what the database
// records, and nobody need read them. A declaration with exactly these
// arguments succeeds only on a queue that has them.
func TestDeadQueue_IsBoundedAndDropsItsOldestCopies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dead := broker.DefaultDeadTopic
	pub, _ := b.clients(t, dead)
	queue := topology{cfg: b.cfg}.topicQueue(dead)
	ctx := context.Background()
	msgs := make([]*broker.Message, deadMaxLength+1)
	for i := range msgs {
		msgs[i] = &broker.Message{Topic: dead, Key: "k" + strings.Repeat("x", i%7), DeliverAt: time.Now()}
	}
	if err := pub.Publish(ctx, msgs...); err != nil {
		t.Fatalf("publishing %d dead copies: %v; want every one taken", len(msgs), err)
	}
	want := amqp.Table{"x-queue-type": "quorum", "x-max-length": int64(deadMaxLength), "x-max-length-bytes": int64(deadMaxBytes), "x-overflow": "drop-head"}
	q, err := b.channel(t).QueueDeclare(queue, true, false, false, false, want)
	if err != nil {
		t.Fatalf("the dead queue does not have the bound's arguments %v: %v", want, err)
	}
	if q.Messages != deadMaxLength {
		t.Fatalf("the dead queue holds %d copies after %d; want its bound, %d", q.Messages, len(msgs), deadMaxLength)
	}
}

// A dead queue an earlier version declared unbounded (other arguments) is
// used as it is, with a warning: every dead-letter publish failing until an
// operator deletes it would be worse.
func TestDeadQueue_DeclaredByAnEarlierVersionStillTakesCopies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dead := broker.DefaultDeadTopic
	b.topic(dead)
	queue := topology{cfg: b.cfg}.topicQueue(dead)
	if _, err := b.channel(t).QueueDeclare(queue, true, false, false, false,
		amqp.Table{"x-queue-type": "quorum", "x-max-length": int64(DefaultMaxLength), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	b.cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	pub, sub := b.clients(t, dead)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, &broker.Message{Topic: dead, Key: "copy", DeliverAt: time.Now()}); err != nil {
		t.Fatalf("a dead copy into the old dead queue: %v", err)
	}
	deliveries, err := sub.Subscribe(ctx, dead)
	if err != nil {
		t.Fatalf("subscribing to the old dead queue: %v", err)
	}
	select {
	case d := <-deliveries:
		if d == nil || d.Message == nil || d.Message.Key != "copy" {
			t.Fatalf("got %+v, want the copy", d)
		}
		_ = d.Acker.Ack()
	case <-ctx.Done():
		t.Fatal("the copy never came out of the old dead queue")
	}
	if !strings.Contains(logs.String(), "the dead queue has other arguments") {
		t.Fatalf("no warning that the dead queue is not bounded; logs:\n%s", logs.String())
	}
}
