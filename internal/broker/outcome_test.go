package broker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
)

func TestConsumer_SkipIsAckedOnceAndReportedAsSkipped(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	var (
		mu       sync.Mutex
		runs     int
		handled  int
		outcomes []string
	)
	sub := &countingSub{Subscriber: bd.b}
	bd.startOn(t, sub, func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		runs++
		mu.Unlock()
		return fmt.Errorf("wrapped: %w", broker.Skip("cancelled"))
	}, broker.ConsumerConfig{Hooks: broker.Hooks{
		Handled: func(string, time.Duration) { mu.Lock(); handled++; mu.Unlock() },
		Settled: func(topic string, o broker.Outcome, reason string) {
			mu.Lock()
			outcomes = append(outcomes, topic+" "+string(o)+" "+reason)
			mu.Unlock()
		},
	}})
	bd.publish(t, "k", time.Now())
	eventually(t, "the ack", func() bool { return bd.b.Stats().Acked == 1 })
	// The Settled hook runs after the ack: once it reported, a second ack
	// of the same settle would have been counted already.
	eventually(t, "the outcome", func() bool { mu.Lock(); defer mu.Unlock(); return len(outcomes) > 0 })
	// A redelivery would be handled at once: give it time to show, then
	// read the counters again.
	time.Sleep(50 * time.Millisecond)
	if s, acks, nacks := bd.b.Stats(), sub.acks.Load(), sub.nacks.Load(); acks != 1 || nacks != 0 || s.Acked != 1 || s.Delivered != 1 {
		t.Fatalf("Ack called %d times, Nack %d, broker %+v; want one delivery acked exactly once", acks, nacks, s)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 || handled != 0 || len(outcomes) != 1 || outcomes[0] != "orders skipped cancelled" {
		t.Fatalf("runs %d, Handled %d, outcomes %q; want 1 run, no Handled, one skip", runs, handled, outcomes)
	}
	if bd.dead.get("k") != nil {
		t.Fatal("a skipped message went to dead")
	}
}
