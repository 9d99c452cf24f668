package broker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// A failed message must come back no sooner than its backoff, and the
// backoff must grow with each attempt: a retry due at once turns a failing
// handler into a busy loop against the database and the broker, and a
// backoff stuck at Initial hammers a dependency that is down for longer.
// Only lower bounds are checked, so a slow box can make the retries late
// but never make the test fail.
func TestConsumer_RetriesWaitOutABackoffThatGrowsWithEachAttempt(t *testing.T) {
	t.Parallel()
	const (
		initial = 300 * time.Millisecond
		jitter  = 0.1
		// slack covers DeliverAt being cut to the millisecond.
		slack = 2 * time.Millisecond
	)
	bd := setup(t, memory.Config{})

	type run struct {
		attempt int
		due     time.Time // the message's DeliverAt as the handler saw it
		started time.Time
		failed  time.Time // when the handler returned its error; zero if it succeeded
	}
	var mu sync.Mutex
	var runs []run
	retryDue := map[int]time.Time{} // by attempt, the DeliverAt OnRetry was told
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		r := run{attempt: m.Attempt, due: m.DeliverAt, started: time.Now()}
		var err error
		if m.Attempt < 2 {
			err = errors.New("the dependency is down")
			r.failed = time.Now()
		}
		mu.Lock()
		runs = append(runs, r)
		mu.Unlock()
		return err
	}, broker.ConsumerConfig{
		MaxAttempts: 5,
		Backoff:     broker.Backoff{Initial: initial, Multiplier: 2, Jitter: jitter},
		OnRetry: func(ctx context.Context, m *broker.Message, cause error) error {
			mu.Lock()
			retryDue[m.Attempt] = m.DeliverAt
			mu.Unlock()
			return nil
		},
	})
	bd.publish(t, "k", time.Now())

	if !testutil.Eventually(30*time.Second, 10*time.Millisecond, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(runs) >= 3
	}) {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("after 30s the handler ran %d times; want 3 (two failures, then success)", len(runs))
	}
	mu.Lock()
	defer mu.Unlock()
	for i, r := range runs[:3] {
		if r.attempt != i {
			t.Fatalf("run %d was attempt %d; want %d", i, r.attempt, i)
		}
		// The consumer holds an early message, so no attempt may start
		// before the due time it carries.
		if r.started.Before(r.due) {
			t.Errorf("attempt %d started %v before its due time", i, r.due.Sub(r.started))
		}
	}
	for attempt := 1; attempt <= 2; attempt++ {
		prev, cur := runs[attempt-1], runs[attempt]
		// Retry n waits Initial × Multiplier^(n−1), less at most Jitter
		// of it, counted from when the consumer saw the failure, which is
		// after the handler returned it.
		least := time.Duration(float64(initial) * float64(int(1)<<(attempt-1)) * (1 - jitter))
		due, ok := retryDue[attempt]
		if !ok {
			t.Fatalf("OnRetry was not told of retry %d", attempt)
		}
		if !due.Equal(cur.due) {
			t.Errorf("OnRetry was told retry %d is due %v, but it was published due %v", attempt, due, cur.due)
		}
		if earliest := prev.failed.Add(least - slack); due.Before(earliest) {
			t.Errorf("retry %d due %v after its failure; want at least %v", attempt, due.Sub(prev.failed), least)
		}
		if earliest := prev.failed.Add(least - slack); cur.started.Before(earliest) {
			t.Errorf("retry %d started %v after its failure; want at least %v", attempt, cur.started.Sub(prev.failed), least)
		}
	}
}
