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

// A custom level list whose smallest level is longer than the hold window:
// a remainder between the two cannot be hopped (the planner says "now"), so
// the consumer must hold it, not re-publish it in a hot loop.
func TestConsumer_RemainderBelowSmallestLevelIsHeldNotHopped(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{Limits: broker.Limits{Levels: []time.Duration{2 * time.Second, 6 * time.Second}}})
	var hops atomic.Int64
	handled := make(chan time.Time, 1)
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		handled <- time.Now()
		return nil
	}, broker.ConsumerConfig{
		HoldWindow: 100 * time.Millisecond,
		Hooks:      broker.Hooks{Hopped: func(string, int) { hops.Add(1) }},
	})
	due := time.Now().Add(time.Second)
	bd.publish(t, "k", due)
	select {
	case at := <-handled:
		if at.Before(broker.MillisUTC(due)) {
			t.Fatalf("handled %v before due", broker.MillisUTC(due).Sub(at))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not handled within 10s")
	}
	if n, pub := hops.Load(), bd.b.Stats().Published; n != 0 || pub != 1 {
		t.Fatalf("%d hops and %d publishes for one message whose remainder no level can carry; want 0 and 1", n, pub)
	}
}

// Every hop must carry the message closer to due. The consumer asks
// Limits.Plan once a hop; this replays that chain of plans on a simulated
// clock (the consumer itself is not run: a chain of hours of hops would
// take hours), so on any limits it ends in at most MaxHops publishes, then
// a wait in memory.
func FuzzPlanChainMakesProgress(f *testing.F) {
	f.Add(int64(10*time.Second), int64(30*time.Second), int64(0), int64(7*time.Second), int64(5*time.Second))
	f.Add(int64(time.Second), int64(5*time.Second), int64(0), int64(4500*time.Millisecond), int64(500*time.Millisecond))
	f.Add(int64(0), int64(0), int64(time.Hour), int64(50*time.Hour), int64(5*time.Second))
	f.Fuzz(func(t *testing.T, l1, l2, maxHop, remaining, hold int64) {
		l := broker.Limits{MaxHop: time.Duration(maxHop)}
		if l1 > 0 && l2 > l1 {
			l.Levels = []time.Duration{time.Duration(l1), time.Duration(l2)}
		}
		if l.Validate() != nil || hold <= 0 || remaining <= 0 {
			return
		}
		r := time.Duration(remaining) % (400 * 24 * time.Hour)
		if l.MaxHop > 0 && l.MaxHop < time.Millisecond || len(l.Levels) > 0 && l.Levels[0] < time.Millisecond {
			return
		}
		if l.MaxHop > 0 && len(l.Levels) == 0 && r/l.MaxHop > 10_000 || len(l.Levels) > 0 && r/l.Levels[len(l.Levels)-1] > 10_000 {
			return
		}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		due := now.Add(r)
		publishes := 0
		for due.Sub(now) > time.Duration(hold) {
			h := l.Plan(now, due)
			if h.Delay <= 0 {
				break // the consumer holds it in memory
			}
			before := due.Sub(now)
			now = now.Add(h.Delay)
			if due.Sub(now) >= before || now.After(due) {
				t.Fatalf("limits %+v: hop of %v from %v before due made no progress or passed due", l, h.Delay, before)
			}
			publishes++
			if bound := l.MaxHops(r); publishes > bound {
				t.Fatalf("limits %+v, remaining %v: %d hops, more than MaxHops %d", l, r, publishes, bound)
			}
		}
	})
}

func TestConsumer_MessageNamingAnotherTopicIsRefusedAndNeverRun(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	var ran atomic.Int64
	bd.start(t, func(ctx context.Context, m *broker.Message) error { ran.Add(1); return nil }, broker.ConsumerConfig{})
	forged := &broker.Message{Topic: "other", Key: "forged", DeliverAt: broker.MillisUTC(time.Now().Add(time.Hour))}
	if err := bd.b.PublishRaw(bd.topic, broker.Encode(forged), nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the forged message dead", func() bool { return bd.dead.get("forged") != nil })
	if err := bd.dead.get("forged"); !errors.Is(err, broker.ErrWrongTopic) {
		t.Fatalf("dead reason %v, want ErrWrongTopic", err)
	}
	// Published counts the forged message itself, and nothing after it.
	if ran.Load() != 0 || bd.b.Ready("other") != 0 || bd.b.Stats().Published != 1 {
		t.Fatalf("a message for another topic ran %d times or was re-published (%d waiting in other, %d published)",
			ran.Load(), bd.b.Ready("other"), bd.b.Stats().Published)
	}
}

func TestConsumer_EarlyByTheReferenceClockWaitsWithoutCountingAnAttempt(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	var mu sync.Mutex
	var calls []int
	var retries atomic.Int64
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, m.Attempt)
		if len(calls) == 1 {
			return &broker.EarlyError{Remaining: 150 * time.Millisecond}
		}
		return nil
	}, broker.ConsumerConfig{Hooks: broker.Hooks{Retried: func(string, int) { retries.Add(1) }}})
	start := time.Now()
	bd.publish(t, "k", start)
	eventually(t, "the second run", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) == 2 })
	mu.Lock()
	defer mu.Unlock()
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Fatalf("ran again after %v, before the 150ms the reference clock asked for", took)
	}
	if calls[1] != 0 || retries.Load() != 0 {
		t.Fatalf("attempts %v, %d retries: an early task must not count an attempt", calls, retries.Load())
	}
}

func TestConsumer_HopTheBrokerRefusesForGoodGoesDead(t *testing.T) {
	t.Parallel()
	var refuse atomic.Bool
	// One hop is at most 100ms, so the message comes back early and needs
	// another hop, which the broker then refuses.
	bd := setup(t, memory.Config{Limits: broker.Limits{MaxHop: 100 * time.Millisecond}, BeforePublish: func(m *broker.Message) error {
		if refuse.Load() {
			return broker.ErrRejected
		}
		return nil
	}})
	due := time.Now().Add(time.Hour)
	bd.publish(t, "k", due)
	refuse.Store(true)
	var ran atomic.Int64
	bd.start(t, func(ctx context.Context, m *broker.Message) error { ran.Add(1); return nil }, broker.ConsumerConfig{})
	eventually(t, "the message dead", func() bool { return bd.dead.get("k") != nil })
	if err := bd.dead.get("k"); !errors.Is(err, broker.ErrRejected) || ran.Load() != 0 {
		t.Fatalf("dead reason %v (want ErrRejected), ran %d", err, ran.Load())
	}
}

func TestConsumer_OnRetrySeesTheNextAttemptBeforeItIsPublished(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	type rec struct {
		attempt   int
		at        time.Time
		published int
	}
	recs := make(chan rec, 4)
	var fail atomic.Bool
	fail.Store(true)
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		if fail.Swap(false) {
			return errors.New("boom")
		}
		return nil
	}, broker.ConsumerConfig{
		Backoff: broker.Backoff{Initial: 50 * time.Millisecond},
		OnRetry: func(ctx context.Context, m *broker.Message, cause error) error {
			recs <- rec{m.Attempt, m.DeliverAt, bd.b.Stats().Published}
			return nil
		},
	})
	bd.publish(t, "k", time.Now())
	eventually(t, "the retry acked", func() bool { return bd.b.Stats().Acked == 2 })
	r := <-recs
	if r.attempt != 1 || r.at.Before(time.Now().Add(-time.Minute)) || r.published != 1 {
		t.Fatalf("OnRetry saw attempt %d due %v with %d published; want attempt 1 before the retry was published", r.attempt, r.at, r.published)
	}
}
