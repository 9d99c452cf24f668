package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/testutil"
	"github.com/delaybridge/delaybridge/outbox"
)

// keysPublisher records the key of every message handed to Publish,
// whatever the broker then makes of it.
type keysPublisher struct {
	broker.Publisher
	mu   sync.Mutex
	keys []string
}

func (p *keysPublisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	p.mu.Lock()
	for _, m := range msgs {
		p.keys = append(p.keys, m.Key)
	}
	p.mu.Unlock()
	return p.Publisher.Publish(ctx, msgs...)
}

func (p *keysPublisher) sent() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.keys...)
}

// The lookahead is a bound on the due time, not a hint: with the relay's
// clock standing still, a row due exactly a lookahead away goes out and
// one due a millisecond later stays in the database.
func TestRelay_LookaheadLetsNoRowDueAMillisecondPastItOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	now := time.Now().Truncate(time.Millisecond)
	const lookahead = time.Minute
	b.schedule(t, outbox.Task{Topic: "edge", Key: "at-the-edge", DueAt: now.Add(lookahead)})
	b.schedule(t, outbox.Task{Topic: "edge", Key: "past-the-edge", DueAt: now.Add(lookahead + time.Millisecond)})
	b.schedule(t, outbox.Task{Topic: "edge", Key: "two-lookaheads", DueAt: now.Add(2 * lookahead)})
	r := newRelay(t, b, mem, outbox.RelayConfig{Lookahead: lookahead, Now: func() time.Time { return now }})
	if n, err := r.Once(b.ctx); err != nil || n != 1 {
		t.Fatalf("Once = %d, %v; want only the row due exactly a lookahead away", n, err)
	}
	for key, want := range map[string]outbox.State{"at-the-edge": outbox.StatePublished, "past-the-edge": outbox.StatePending, "two-lookaheads": outbox.StatePending} {
		if info, err := outbox.Get(b.ctx, b.db, "edge", key); err != nil || info.State != want {
			t.Errorf("%s: %+v, %v; want %s", key, info, err, want)
		}
	}
	if got := mem.Stats().Published; got != 1 {
		t.Fatalf("the broker stored %d messages, want 1", got)
	}
}

// A broker advising a lookahead longer than one of its hops gets the hop:
// the default never makes a task wait in the broker for two hops.
func TestNewRelay_DefaultLookaheadIsCutToOneHop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{Limits: broker.Limits{Lookahead: time.Hour, MaxHop: time.Minute}})
	t.Cleanup(func() { _ = mem.Close() })
	r, err := outbox.NewRelay(b.db, mem, outbox.RelayConfig{Logger: quiet()})
	if err != nil {
		t.Fatalf("NewRelay with the broker's advice: %v", err)
	}
	if got := r.Lookahead(); got != time.Minute {
		t.Fatalf("Lookahead() = %v, want the broker's hop, 1m0s", got)
	}
	b.schedule(t, outbox.Task{Topic: "hop", Key: "in-a-hop", DueAt: time.Now().Add(30 * time.Second)})
	b.schedule(t, outbox.Task{Topic: "hop", Key: "half-an-hour", DueAt: time.Now().Add(30 * time.Minute)})
	if n, err := r.Once(b.ctx); err != nil || n != 1 {
		t.Fatalf("Once = %d, %v; want only the task due within one hop", n, err)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "hop", "half-an-hour"); info.State != outbox.StatePending {
		t.Fatalf("a task due in 30m is %s, want pending under a one-minute hop", info.State)
	}
}

// A row no broker can carry is marked dead without being offered to the
// broker at all: the publish carries only the valid rows beside it.
func TestRelay_AnInvalidRowIsNeverHandedToTheBroker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	pub := &keysPublisher{Publisher: mem}
	due := time.Now().Add(-time.Second).UnixMilli()
	b.insertRaw(t, "carry", []byte("good"), due, 0, nil, nil, "pending")
	b.insertRaw(t, "carry", []byte("epoch"), 0, 0, nil, nil, "pending")
	b.insertRaw(t, "carry", []byte("bad-trace"), due, 0, nil, "a\x02b", "pending")
	if n, err := newRelay(t, b, pub, outbox.RelayConfig{}).Once(b.ctx); err != nil || n != 3 {
		t.Fatalf("Once = %d, %v; want 3 rows claimed", n, err)
	}
	if got := pub.sent(); len(got) != 1 || got[0] != "good" {
		t.Fatalf("handed to the broker: %q; want only the valid row", got)
	}
	if got := b.count(t, "task_key IN ('epoch', 'bad-trace') AND state = 'dead' AND publish_attempts = 1 AND lease_owner = 0 AND last_error LIKE 'invalid row: %'"); got != 2 {
		t.Fatalf("%d of the 2 invalid rows are dead with their reason", got)
	}
	if got := b.count(t, "task_key = 'good' AND state = 'published'"); got != 1 {
		t.Fatal("the valid row was not published")
	}
}

// A relay stopped during a publish gives back the rows the broker did not
// confirm as they were, not as failures: no attempt counted, no backoff, so
// the next relay publishes them at once. The confirmed ones are published.
func TestRelay_StoppedMidPublishReleasesTheRowsTheBrokerDidNotConfirm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	down := true
	mem := memory.New(memory.Config{BeforePublish: func(m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if down && m.Key != "confirmed" {
			return errors.New("connection reset")
		}
		return nil
	}})
	t.Cleanup(func() { _ = mem.Close() })
	b.schedule(t, outbox.Task{Topic: "stop", Key: "confirmed", DueAt: time.Now()})
	for i := range 3 {
		b.schedule(t, outbox.Task{Topic: "stop", Key: fmt.Sprintf("unconfirmed-%d", i), DueAt: time.Now()})
	}
	// The clock stands still: a backoff recorded by mistake would keep the
	// rows from the claim below.
	now := time.Now()
	clock := func() time.Time { return now }
	ctx, cancel := context.WithCancel(b.ctx)
	if _, err := newRelay(t, b, &cancelAfterPublish{mem, cancel}, outbox.RelayConfig{Now: clock}).Once(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Once = %v, want the context's error", err)
	}
	if got := b.count(t, "task_key = 'confirmed' AND state = 'published' AND lease_owner = 0"); got != 1 {
		t.Fatal("the row the broker confirmed is not marked published")
	}
	if got := b.count(t, "task_key LIKE 'unconfirmed-%' AND state = 'pending' AND lease_owner = 0 AND next_attempt_ms = 0 AND publish_attempts = 0 AND last_error IS NULL"); got != 3 {
		t.Fatalf("%d of the 3 unconfirmed rows were given back untouched", got)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	if n, err := newRelay(t, b, mem, outbox.RelayConfig{Now: clock}).Once(b.ctx); err != nil || n != 3 {
		t.Fatalf("the next relay, same instant: Once = %d, %v; want the 3 released rows", n, err)
	}
}

// A row that fails its publish in a full batch, before the point the loops
// resume from, is taken again by the claim from the head that follows the
// first short batch, not a rescan later. The rescan (IdleMax, an hour) and
// the probe (off) cannot find it here; only the return to the head can.
func TestRelay_ARetryBeforeTheResumePointGoesOutOnceTheLoopsCatchUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	failed := false
	mem := memory.New(memory.Config{BeforePublish: func(m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if m.Key == "a" && !failed {
			failed = true
			return errors.New("connection reset")
		}
		return nil
	}})
	t.Cleanup(func() { _ = mem.Close() })
	now := time.Now()
	for i, k := range []string{"a", "b", "c"} {
		b.schedule(t, outbox.Task{Topic: "resume", Key: k, DueAt: now.Add(time.Duration(i-3) * time.Second)})
	}
	// One loop, batches of 2: [a b] (a fails, the loops resume past b),
	// then [c], short.
	r := newRelay(t, b, mem, outbox.RelayConfig{Workers: 1, BatchSize: 2, Lookahead: -1, Probe: -1,
		IdleMin: time.Millisecond, IdleMax: time.Hour, RetryInitial: time.Millisecond})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if !testutil.Eventually(10*time.Second, 10*time.Millisecond, func() bool { return b.count(t, "topic = 'resume' AND state = 'published'") == 3 }) {
		mu.Lock()
		f := failed
		mu.Unlock()
		t.Fatalf("after 10s: %d of 3 published (a failed once: %v); a retry before the resume point waits for the rescan",
			b.count(t, "topic = 'resume' AND state = 'published'"), f)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "resume", "a"); info.PublishAttempts != 2 {
		t.Fatalf("a: %d publish attempts, want 2 (the failure, then the publish)", info.PublishAttempts)
	}
}

// A confirmed publish whose row cannot be marked published is not counted:
// the row keeps its lease and goes out again once it expires, and is
// counted then, so the published count never counts a task twice.
func TestRelay_APublishItCouldNotRecordIsNotCountedPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, outbox.Task{Topic: "unmarked", Key: "k", DueAt: time.Now()})
	// The database refuses the mark (a lost connection or a full disk, in
	// life): a trigger fails every update to state published.
	if _, err := b.db.ExecContext(b.ctx, `CREATE TRIGGER refuse_published BEFORE UPDATE ON delay_task FOR EACH ROW
BEGIN IF NEW.state = 'published' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF; END`); err != nil {
		t.Fatal(err)
	}
	var published int
	r := newRelay(t, b, instantPublisher{}, outbox.RelayConfig{Hooks: outbox.RelayHooks{Published: func(n int, _ time.Duration) { published += n }}})
	if _, err := r.Once(b.ctx); err == nil {
		t.Fatal("Once reported no error though the mark failed")
	}
	if published != 0 {
		t.Fatalf("Published reported %d for a row it could not mark", published)
	}
	if _, err := b.db.ExecContext(b.ctx, "DROP TRIGGER refuse_published"); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "task_key = 'k' AND state = 'pending' AND lease_owner <> 0"); n != 1 {
		t.Fatalf("%d rows still leased pending; want the unmarked row kept for its lease to expire", n)
	}
}
