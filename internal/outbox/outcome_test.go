package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// outcomeLog records the Settled and Handled hooks by key.
type outcomeLog struct {
	mu      sync.Mutex
	byTopic map[string][]string // "outcome/reason", in order
	handled int
}

func (l *outcomeLog) hooks() broker.Hooks {
	return broker.Hooks{
		Handled: func(string, time.Duration) { l.mu.Lock(); l.handled++; l.mu.Unlock() },
		Settled: func(topic string, o broker.Outcome, reason string) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.byTopic[topic] = append(l.byTopic[topic], string(o)+"/"+reason)
		},
	}
}

func (l *outcomeLog) sorted() (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var all []string
	for _, v := range l.byTopic {
		all = append(all, v...)
	}
	sort.Strings(all)
	return strings.Join(all, " "), l.handled
}

// TestConsumer_OutcomesTellAppliedSkippedRetriedAndDeadApart runs one task
// of each kind through the runtime on the real database, one at a time
// (BrokerHandler) and grouped (NewConsumer), and checks the hooks name each
// outcome, and that Handled counts only the applied.
func TestConsumer_OutcomesTellAppliedSkippedRetriedAndDeadApart(t *testing.T) {
	t.Parallel()
	for _, grouped := range []bool{false, true} {
		t.Run(fmt.Sprintf("grouped=%v", grouped), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			now := time.Now().Add(-time.Second)
			applied := b.order(t, "applied", now)
			done := b.order(t, "done", now)
			if o, err := outbox.Handle(b.ctx, b.db, done, cancelOrder("done")); err != nil || o != outbox.Handled {
				t.Fatalf("first handle of done: %v, %v", o, err)
			}
			cancelled := b.order(t, "cancelled", now)
			if err := outbox.Cancel(b.ctx, b.db, "order-cancel", "cancelled"); err != nil {
				t.Fatal(err)
			}
			stale := b.order(t, "stale", now)
			if err := outbox.Reschedule(b.ctx, b.db, "order-cancel", "stale", time.Now().Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
			flaky := b.order(t, "flaky", now)
			poison := b.order(t, "poison", now)

			fn := poisonAndFlaky("poison", "flaky")
			mem := memory.New(memory.Config{})
			t.Cleanup(func() { _ = mem.Close() })
			log := &outcomeLog{byTopic: map[string][]string{}}
			cfg := broker.ConsumerConfig{Logger: quiet(), Concurrency: 2, Hooks: log.hooks(),
				Backoff:    broker.Backoff{Initial: 20 * time.Millisecond, Max: 50 * time.Millisecond},
				DeadLetter: outbox.DeadLetter(b.db, nil), OnRetry: outbox.RecordRetry(b.db)}
			var c *broker.Consumer
			var err error
			if grouped {
				c, err = outbox.NewConsumer(b.db, mem, mem, fn, cfg)
			} else {
				c, err = broker.NewConsumer(mem, mem, outbox.BrokerHandler(b.db, fn), cfg)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(b.ctx, "order-cancel"); err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background()) //nolint:errcheck
			if err := mem.Publish(b.ctx, applied, done, cancelled, stale, flaky, poison); err != nil {
				t.Fatal(err)
			}
			// applied, flaky's second attempt; done, cancelled, stale
			// skipped; flaky's first retried; poison dead.
			const want = "applied/ applied/ dead/ retried/ skipped/cancelled skipped/done skipped/stale"
			var got string
			var handled int
			if !testutil.Eventually(15*time.Second, 10*time.Millisecond, func() bool {
				got, handled = log.sorted()
				return got == want && handled == 2
			}) {
				t.Fatalf("outcomes %q (Handled fired %d times); want %q and 2", got, handled, want)
			}
			info, err := outbox.Get(b.ctx, b.db, "order-cancel", "poison")
			if err != nil || info.State != outbox.StateDead {
				t.Fatalf("poison task %+v, %v; want dead", info, err)
			}
			if st, cancels := b.orderRow(t, "cancelled"); st != "UNPAID" || cancels != 0 {
				t.Fatalf("the cancelled task's order is %s after %d cancels", st, cancels)
			}
		})
	}
}

func TestHandler_ReturnsASkipNamingTheReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now().Add(-time.Second))
	h := outbox.BrokerHandler(b.db, cancelOne)
	if err := h(b.ctx, msg); err != nil {
		t.Fatalf("first run: %v", err)
	}
	err := h(b.ctx, msg)
	var skip *broker.SkipError
	if !errors.Is(err, broker.ErrSkipped) || !errors.As(err, &skip) || skip.Reason != "done" {
		t.Fatalf("second run returned %v, want a skip with reason done", err)
	}
}

// poisonAndFlaky is cancelOne, except that the task keyed poison fails for
// good and the one keyed flaky fails its first attempt.
func poisonAndFlaky(poison, flaky string) outbox.HandlerFunc {
	var mu sync.Mutex
	failedOnce := false
	return func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		switch m.Key {
		case poison:
			return broker.Permanent(errors.New("poison"))
		case flaky:
			mu.Lock()
			first := !failedOnce
			failedOnce = true
			mu.Unlock()
			if first {
				return errors.New("flaky")
			}
		}
		return cancelOne(ctx, tx, m)
	}
}
