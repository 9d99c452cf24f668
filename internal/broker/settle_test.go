package broker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
)

// errBrokerDown is a publish failure that is not permanent: the runtime must
// give the delivery back rather than settle it.
var errBrokerDown = errors.New("broker unreachable")

// firstSettle waits until the broker counted the first ack or nack of
// the only message and fails unless it was a nack. The redelivery may be
// acked by the time it looks, but never before the nack.
func firstSettle(t *testing.T, b *memory.Broker, what string) {
	t.Helper()
	var s memory.Stats
	eventually(t, "the delivery settled", func() bool { s = b.Stats(); return s.Acked+s.Nacked > 0 })
	if s.Nacked != 1 {
		t.Fatalf("after %s: %+v; want the delivery nacked first, not acked", what, s)
	}
}

// next returns the next value of ch, failing after a generous wait.
func next[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	panic("unreachable")
}

// A retry whose publish fails (the broker is down, not refusing it for
// good) must give the delivery back: acking it would lose the message, as
// would acking it before the retry was published.
func TestConsumer_RetryWhosePublishFailsIsGivenBackNotAcked(t *testing.T) {
	t.Parallel()
	var bd *bundle
	var retryPublishes atomic.Int64
	atRetry := make(chan memory.Stats, 2) // the broker's counters as each retry is published
	bd = setup(t, memory.Config{BeforePublish: func(m *broker.Message) error {
		if m.Attempt < 1 {
			return nil
		}
		n := retryPublishes.Add(1)
		if n <= 2 {
			atRetry <- bd.b.Stats()
		}
		if n == 1 {
			return errBrokerDown
		}
		return nil
	}})
	var mu sync.Mutex
	runs := map[int]int{} // by attempt
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		runs[m.Attempt]++
		if m.Attempt == 0 {
			return errors.New("boom")
		}
		return nil
	}, broker.ConsumerConfig{Backoff: broker.Backoff{Initial: 20 * time.Millisecond}})
	bd.publish(t, "k", time.Now())

	if s := next(t, atRetry, "the retry published"); s.Acked != 0 {
		t.Fatalf("acked %d before the retry was published", s.Acked)
	}
	firstSettle(t, bd.b, "the retry's publish failed")
	if s := next(t, atRetry, "the redelivered message retried"); s.Acked != 0 || s.Nacked != 1 {
		t.Fatalf("the second retry was published with the broker at %+v; want the original still unacked", s)
	}
	eventually(t, "the retry handled and acked", func() bool { return bd.b.Stats().Acked == 2 })
	mu.Lock()
	defer mu.Unlock()
	if runs[0] != 2 || runs[1] != 1 || bd.dead.get("k") != nil {
		t.Fatalf("runs by attempt %v, dead %v; want attempt 0 redelivered once, attempt 1 once, nothing dead", runs, bd.dead.get("k"))
	}
}

// An early message whose next hop cannot be published is given back, not
// acked: the hop is published before the original is acked.
func TestConsumer_HopWhosePublishFailsIsGivenBackNotAcked(t *testing.T) {
	t.Parallel()
	var bd *bundle
	var hopPublishes atomic.Int64
	atHop := make(chan memory.Stats, 2)
	// One hop is at most 100ms, so a message due in an hour comes back early
	// and needs another hop.
	bd = setup(t, memory.Config{Limits: broker.Limits{MaxHop: 100 * time.Millisecond}, BeforePublish: func(m *broker.Message) error {
		if m.Hop < 1 {
			return nil
		}
		n := hopPublishes.Add(1)
		if n <= 2 {
			atHop <- bd.b.Stats()
		}
		if n == 1 {
			return errBrokerDown
		}
		return nil
	}})
	hopped := make(chan int, 1)
	var ran atomic.Int64
	bd.start(t, func(ctx context.Context, m *broker.Message) error { ran.Add(1); return nil }, broker.ConsumerConfig{
		Hooks: broker.Hooks{Hopped: func(_ string, hop int) {
			select {
			case hopped <- hop:
			default:
			}
		}},
	})
	bd.publish(t, "k", time.Now().Add(time.Hour))

	if s := next(t, atHop, "the hop published"); s.Acked != 0 {
		t.Fatalf("acked %d before the hop was published", s.Acked)
	}
	firstSettle(t, bd.b, "the hop's publish failed")
	if s := next(t, atHop, "the redelivered message hopped"); s.Acked != 0 || s.Delivered != 2 {
		t.Fatalf("the second hop was published with the broker at %+v; want the original redelivered and still unacked", s)
	}
	select {
	case hop := <-hopped:
		if hop != 1 {
			t.Fatalf("first hop published was %d, want 1", hop)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the redelivered message was never hopped")
	}
	eventually(t, "the original acked", func() bool { return bd.b.Stats().Acked >= 1 })
	if ran.Load() != 0 || bd.dead.get("k") != nil {
		t.Fatalf("an early message ran %d times or went dead (%v)", ran.Load(), bd.dead.get("k"))
	}
}

// A dead letter that fails leaves the delivery unacked: it is given back
// and dead-lettered again on redelivery.
func TestConsumer_DeadLetterThatFailsIsGivenBackNotAcked(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	var deadCalls atomic.Int64
	atDead := make(chan memory.Stats, 2)
	var runs atomic.Int64
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		runs.Add(1)
		return broker.Permanent(errors.New("poison"))
	}, broker.ConsumerConfig{DeadLetter: broker.DeadLetterFunc(func(ctx context.Context, d *broker.Delivery, reason error) error {
		n := deadCalls.Add(1)
		if n <= 2 {
			atDead <- bd.b.Stats()
		}
		if n == 1 {
			return errBrokerDown
		}
		return nil
	})})
	bd.publish(t, "k", time.Now())

	if s := next(t, atDead, "the dead letter called"); s.Acked != 0 {
		t.Fatalf("acked %d before the dead letter took it", s.Acked)
	}
	firstSettle(t, bd.b, "the dead letter failed")
	if s := next(t, atDead, "the redelivered message dead-lettered"); s.Acked != 0 || s.Delivered != 2 {
		t.Fatalf("dead-lettered again with the broker at %+v; want the original redelivered and still unacked", s)
	}
	eventually(t, "the dead-lettered delivery acked", func() bool { return bd.b.Stats().Acked == 1 })
	if n, r := deadCalls.Load(), runs.Load(); n != 2 || r != 2 {
		t.Fatalf("dead letter called %d times, handler ran %d times; want 2 and 2", n, r)
	}
}

// recordingAcker reports each settle call on a channel.
type recordingAcker struct{ settled chan<- string }

func (a recordingAcker) Ack() error  { a.settled <- "ack"; return nil }
func (a recordingAcker) Nack() error { a.settled <- "nack"; return nil }

// A handler interrupted by a forced shutdown (Close gave up waiting) fails
// with its context's error; that is no attempt of its own: the delivery is
// given back, neither dead-lettered nor acked, even on its last attempt.
func TestConsumer_ForcedShutdownGivesBackTheDeliveryOnItsLastAttempt(t *testing.T) {
	t.Parallel()
	sub := givenBackSub{ch: make(chan *broker.Delivery, 1)}
	pub := memory.New(memory.Config{})
	t.Cleanup(func() { _ = pub.Close() })
	dead := &deadBox{reasons: map[string]error{}}
	started := make(chan struct{})
	c, err := broker.NewConsumer(sub, pub, func(ctx context.Context, m *broker.Message) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}, broker.ConsumerConfig{Logger: quiet(), DeadLetter: dead, MaxAttempts: 1, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
	settled := make(chan string, 4)
	sub.ch <- &broker.Delivery{Message: &broker.Message{Topic: "orders", Key: "k", DeliverAt: broker.MillisUTC(time.Now())}, Acker: recordingAcker{settled: settled}}
	<-started
	close(sub.ch)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a handler running = %v, want the deadline", err)
	}
	select {
	case got := <-settled:
		if got != "nack" {
			t.Fatalf("the interrupted delivery was settled with %s, want nack", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the interrupted delivery was never settled")
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := c.Close(ctx2); err != nil {
		t.Fatalf("Close after the handler returned: %v", err)
	}
	select {
	case got := <-settled:
		t.Fatalf("settled again with %s", got)
	default:
	}
	if err := dead.get("k"); err != nil {
		t.Fatalf("an interrupted delivery went dead: %v", err)
	}
}
