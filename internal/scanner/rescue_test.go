package scanner_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/store"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// Rows whose re-publish keeps failing (their topic was deleted) are older
// than a lost task and would fill every batch of an oldest-first claim:
// their per-row backoff lets the lost task through.
func TestScanner_FailingRowsOlderThanALostTaskNeverStopItsRescue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i, key := range []string{"gone-1", "gone-2", "gone-3"} {
		b.task(t, key, outbox.StatePublished, time.Now().Add(-time.Hour+time.Duration(i)*time.Second))
	}
	b.task(t, "lost", outbox.StatePublished, time.Now().Add(-time.Minute))
	gone := errors.New("topic not found")
	var rescued []string
	pub := publishFunc(func(_ context.Context, msgs ...*broker.Message) error {
		pe := &broker.PublishError{Failed: map[int]error{}}
		for i, m := range msgs {
			if m.Key == "lost" {
				rescued = append(rescued, m.Key)
				continue
			}
			pe.Failed[i] = gone
		}
		if len(pe.Failed) == 0 {
			return nil
		}
		return pe
	})
	s := b.scanner(t, pub, scanner.Config{BatchSize: 2, RetryInitial: time.Minute})
	for range 3 {
		if _, err := s.Rescue(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(rescued) != 1 {
		t.Fatalf("the lost task was rescued %d times in 3 passes behind failing rows, want once", len(rescued))
	}
	var got int
	if err := b.db.QueryRow("SELECT COUNT(*) FROM delay_task WHERE task_key LIKE 'gone-%' AND last_error LIKE 'rescue failed: topic not found%' AND publish_attempts = 1 AND next_attempt_ms > ?",
		time.Now().Add(30*time.Second).UnixMilli()).Scan(&got); err != nil || got != 3 {
		t.Fatalf("%d failing rows carry their failure and a backoff (%v), want 3", got, err)
	}
}

// Each row whose re-publish failed keeps its own error, not the batch's
// first one: an operator reading last_error sees what happened to it.
func TestScanner_EachFailedRowKeepsItsOwnReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.task(t, "full", outbox.StatePublished, time.Now().Add(-time.Hour))
	b.task(t, "timeout", outbox.StatePublished, time.Now().Add(-time.Minute))
	b.task(t, "refused", outbox.StatePublished, time.Now().Add(-time.Minute))
	reasons := map[string]error{"full": errors.New("queue full"), "timeout": errors.New("send timed out"), "refused": broker.Permanent(errors.New("message too large"))}
	pub := publishFunc(func(_ context.Context, msgs ...*broker.Message) error {
		pe := &broker.PublishError{Failed: map[int]error{}}
		for i, m := range msgs {
			pe.Failed[i] = reasons[m.Key]
		}
		return pe
	})
	if _, err := b.scanner(t, pub, scanner.Config{}).Rescue(b.ctx); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"full": "rescue failed: queue full", "timeout": "rescue failed: send timed out", "refused": "rescue rejected: message too large"} {
		info, err := outbox.Get(b.ctx, b.db, "scan", key)
		if err != nil {
			t.Fatal(err)
		}
		if info.LastError != want {
			t.Errorf("%s: last_error %q, want %q", key, info.LastError, want)
		}
	}
}

func TestScanner_RefusedForGoodGoesDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.task(t, "refused", outbox.StatePublished, time.Now().Add(-time.Minute))
	pub := publishFunc(func(context.Context, ...*broker.Message) error { return broker.ErrRejected })
	if _, err := b.scanner(t, pub, scanner.Config{}).Rescue(b.ctx); err != nil {
		t.Fatal(err)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "scan", "refused"); info.State != outbox.StateDead {
		t.Fatalf("state %s after the broker refused the rescue for good, want dead", info.State)
	}
}

// Overdue counts from the latest of due, published and next attempt.
func TestScanner_OverdueCountsFromTheLastPublishAndTheRecordedRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := time.Now().Add(-time.Hour)
	b.task(t, "published-late", outbox.StatePublished, old)
	if _, err := b.db.Exec("UPDATE delay_task SET published_ms = ? WHERE task_key = 'published-late'", time.Now().UnixMilli()); err != nil {
		t.Fatal(err)
	}
	b.task(t, "retrying", outbox.StatePublished, old)
	info, err := outbox.Get(b.ctx, b.db, "scan", "retrying")
	if err != nil {
		t.Fatal(err)
	}
	// RecordRetry counts from the row, not the message: three failed runs
	// recorded, this one makes the fourth.
	if _, err := b.db.Exec("UPDATE delay_task SET attempts = 3 WHERE task_key = 'retrying'"); err != nil {
		t.Fatal(err)
	}
	retry := &broker.Message{TaskID: info.ID, Topic: "scan", Key: "retrying", Attempt: 4, DeliverAt: time.Now().Add(30 * time.Second)}
	if err := outbox.RecordRetry(b.db)(b.ctx, retry, errors.New("payment service down")); err != nil {
		t.Fatal(err)
	}
	s := b.scanner(t, b.mem, scanner.Config{Grace: 5 * time.Second})
	if n, err := s.Rescue(b.ctx); err != nil || n != 0 {
		t.Fatalf("Rescue = %d, %v; a task published just now and one waiting out a retry are not overdue", n, err)
	}
	// Once the retry is overdue too, the rescue carries its attempt, so
	// MaxAttempts still counts.
	later := func() time.Time { return time.Now().Add(time.Minute) }
	// The subscription's context also covers the rescue's database work,
	// so it is generous; when it ends the channel closes.
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	ch, err := b.mem.Subscribe(ctx, "scan")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.scanner(t, b.mem, scanner.Config{Grace: 5 * time.Second, Now: later}).Rescue(b.ctx); err != nil || n != 2 {
		t.Fatalf("Rescue a minute later = %d, %v; want both", n, err)
	}
	for i := range 2 {
		d := <-ch
		if d == nil {
			t.Fatalf("the subscription ended after %d of the 2 rescued messages", i)
		}
		if d.Message.Key == "retrying" && d.Message.Attempt != 4 {
			t.Fatalf("rescued on attempt %d, want the recorded 4", d.Message.Attempt)
		}
		_ = d.Acker.Ack()
	}
}

// A relay that dies after its claim leaves its rows published with no
// message behind them. The scanner publishes them again, but not while
// the relay may still be publishing or recording: not before the publish
// timeout and the time a record may take past the claim, plus the grace.
func TestScanner_RescuesWhatARelayDiedWith(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 3 {
		if _, err := outbox.Schedule(b.ctx, b.db, outbox.Task{Topic: "scan", Key: fmt.Sprint(i), DueAt: time.Now().Add(-time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	// The relay claims, then dies before its publish.
	claimed := make(chan struct{})
	crash := publishFunc(func(context.Context, ...*broker.Message) error {
		close(claimed)
		runtime.Goexit()
		return nil
	})
	r, err := outbox.NewRelay(b.db, crash, outbox.RelayConfig{PublishTimeout: 5 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = r.Once(b.ctx) }()
	<-claimed
	claimedAt := time.Now()
	if !testutil.Eventually(10*time.Second, 10*time.Millisecond, func() bool {
		var n int
		return b.db.QueryRow("SELECT COUNT(*) FROM delay_task WHERE state = 'published'").Scan(&n) == nil && n == 3
	}) {
		t.Fatal("the relay's claim did not commit its rows published")
	}
	at := func(d time.Duration) func() time.Time { return func() time.Time { return claimedAt.Add(d) } }
	lease := 5*time.Second + store.RecordTimeout
	if n, err := b.scanner(t, b.mem, scanner.Config{Grace: time.Second, Now: at(lease)}).Rescue(b.ctx); err != nil || n != 0 {
		t.Fatalf("at the lease's end, before the grace: Rescue = %d, %v; want 0", n, err)
	}
	if n, err := b.scanner(t, b.mem, scanner.Config{Grace: time.Second, Now: at(lease + 2*time.Second)}).Rescue(b.ctx); err != nil || n != 3 {
		t.Fatalf("past the publish timeout and the grace: Rescue = %d, %v; want 3", n, err)
	}
	if got := b.mem.Stats().Published; got != 3 {
		t.Fatalf("%d messages reached the broker, want the 3 the relay never published", got)
	}
}
