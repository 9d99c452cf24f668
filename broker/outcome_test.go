package broker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/memory"
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
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
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
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 || handled != 0 || len(outcomes) != 1 || outcomes[0] != "orders skipped cancelled" {
		t.Fatalf("runs %d, Handled %d, outcomes %q; want 1 run, no Handled, one skip", runs, handled, outcomes)
	}
	if bd.dead.get("k") != nil {
		t.Fatal("a skipped message went to dead")
	}
}
