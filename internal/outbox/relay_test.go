package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// countingPublisher counts confirmed publishes per key on top of a broker.
type countingPublisher struct {
	broker.Publisher
	mu   sync.Mutex
	seen map[string]int
}

func (p *countingPublisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	err := p.Publisher.Publish(ctx, msgs...)
	res := broker.PublishResults(err, len(msgs))
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, m := range msgs {
		if res[i] == nil {
			p.seen[m.Key]++
		}
	}
	return err
}

func newRelay(t *testing.T, b *bundle, pub broker.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	cfg.Logger = quiet()
	r, err := outbox.NewRelay(b.db, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRelay_PublishesPendingRowsAndMarksThemPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	due := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	id := b.schedule(t, outbox.Task{Topic: "relay", Key: "k1", DueAt: due, Payload: []byte("p"), Headers: map[string]string{"h": "v"}, Trace: "tr"})
	n, err := newRelay(t, b, mem, outbox.RelayConfig{}).Once(b.ctx)
	if err != nil || n != 1 {
		t.Fatalf("Once = %d, %v", n, err)
	}
	info, _ := outbox.Get(b.ctx, b.db, "relay", "k1")
	if info.State != outbox.StatePublished || info.PublishAttempts != 1 || info.PublishedAt.IsZero() {
		t.Fatalf("after relay: %+v", info)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	ch, _ := mem.Subscribe(ctx, "relay")
	d := <-ch
	m := d.Message
	if d.Err != nil || m.TaskID != id || m.Key != "k1" || string(m.Payload) != "p" || !m.DeliverAt.Equal(due) || m.Headers["h"] != "v" || m.Trace != "tr" {
		t.Fatalf("published message %+v (err %v)", m, d.Err)
	}
}

func TestRelay_TwoRelaysRacingPublishEachRowOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	pub := &countingPublisher{Publisher: mem, seen: map[string]int{}}
	const n = 3000
	tx, _ := b.db.Begin()
	for i := range n {
		if _, err := outbox.Schedule(b.ctx, tx, outbox.Task{Topic: "race", Key: fmt.Sprint(i), DueAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	for range 2 {
		r := newRelay(t, b, pub, outbox.RelayConfig{BatchSize: 100, Workers: 3, IdleMin: time.Millisecond, IdleMax: 5 * time.Millisecond})
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(ctx) }()
	}
	// The checks below say what is missing after 30s.
	testutil.Eventually(30*time.Second, 20*time.Millisecond, func() bool { return b.count(t, "state = 'pending'") == 0 })
	cancel()
	wg.Wait()
	if got := b.count(t, "state = 'published'"); got != n {
		t.Fatalf("%d rows published, want %d", got, n)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if len(pub.seen) != n {
		t.Fatalf("%d distinct keys published, want %d", len(pub.seen), n)
	}
	for k, c := range pub.seen {
		if c != 1 {
			t.Fatalf("key %s published %d times", k, c)
		}
	}
}

// cancelAfterPublish cancels the relay's context once the broker confirmed,
// as a relay told to stop mid-publish would be.
type cancelAfterPublish struct {
	broker.Publisher
	cancel context.CancelFunc
}

func (p *cancelAfterPublish) Publish(ctx context.Context, msgs ...*broker.Message) error {
	err := p.Publisher.Publish(ctx, msgs...)
	p.cancel()
	return err
}

// A relay stopped mid-publish leaves what the broker confirmed published.
func TestRelay_StoppedMidPublishKeepsWhatTheBrokerConfirmed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	for i := range 5 {
		b.schedule(t, outbox.Task{Topic: "stop", Key: fmt.Sprint(i), DueAt: time.Now()})
	}
	ctx, cancel := context.WithCancel(b.ctx)
	if _, err := newRelay(t, b, &cancelAfterPublish{mem, cancel}, outbox.RelayConfig{}).Once(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Once = %v, want the context's error", err)
	}
	if got := b.count(t, "state = 'published' AND publish_attempts = 1"); got != 5 {
		t.Fatalf("%d rows published, want the 5 the broker confirmed", got)
	}
}

// A relay that dies after its claim leaves the rows published under its
// lease, not pending: no other relay publishes them again, then or after
// the lease (the scanner does, once they are overdue:
// TestScanner_RescuesWhatARelayDiedWith).
func TestRelay_CrashAfterTheClaimLeavesTheRowsToTheScanner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	for i := range 5 {
		b.schedule(t, outbox.Task{Topic: "crash", Key: fmt.Sprint(i), DueAt: time.Now().Add(-time.Millisecond)})
	}
	// A relay claims the rows and dies before its publish.
	crash := &duringPublish{Publisher: mem, f: func(context.Context) { runtime.Goexit() }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = newRelay(t, b, crash, outbox.RelayConfig{}).Once(b.ctx)
	}()
	<-done
	if !testutil.Eventually(10*time.Second, 10*time.Millisecond, func() bool {
		return b.count(t, "state = 'published' AND lease_owner <> 0 AND publish_attempts = 1") == 5
	}) {
		t.Fatal("the dead relay's claim did not leave its 5 rows published under its lease")
	}
	for _, at := range []time.Duration{0, time.Hour} {
		later := func() time.Time { return time.Now().Add(at) }
		if n, err := newRelay(t, b, mem, outbox.RelayConfig{Now: later}).Once(b.ctx); err != nil || n != 0 {
			t.Fatalf("another relay %v later: Once = %d, %v; want 0", at, n, err)
		}
	}
	if n := mem.Stats().Published; n != 0 {
		t.Fatalf("%d messages reached the broker, want 0", n)
	}
}

func TestRelay_PermanentRejectGoesDeadWithoutBlockingTheBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{BeforePublish: func(m *broker.Message) error {
		if m.Key == "poison" {
			return fmt.Errorf("%w: message too large", broker.ErrRejected)
		}
		return nil
	}})
	t.Cleanup(func() { _ = mem.Close() })
	for _, k := range []string{"a", "poison", "b"} {
		b.schedule(t, outbox.Task{Topic: "rej", Key: k, DueAt: time.Now()})
	}
	if _, err := newRelay(t, b, mem, outbox.RelayConfig{}).Once(b.ctx); err != nil {
		t.Fatal(err)
	}
	info, _ := outbox.Get(b.ctx, b.db, "rej", "poison")
	if info.State != outbox.StateDead || info.LastError == "" {
		t.Fatalf("poison row: %+v", info)
	}
	if got := b.count(t, "state = 'published'"); got != 2 {
		t.Fatalf("%d published, want 2", got)
	}
}

func TestRelay_TransientFailureBacksOffTheRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	fail := true
	mem := memory.New(memory.Config{BeforePublish: func(m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return errors.New("connection reset")
		}
		return nil
	}})
	t.Cleanup(func() { _ = mem.Close() })
	b.schedule(t, outbox.Task{Topic: "flaky", Key: "k", DueAt: time.Now()})
	// The relay's clock stands still unless the test moves it: the backoff
	// is compared with it, not with how long the test's statements take.
	var clockMu sync.Mutex
	now := time.Now()
	clock := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	advance := func(d time.Duration) { clockMu.Lock(); defer clockMu.Unlock(); now = now.Add(d) }
	r := newRelay(t, b, mem, outbox.RelayConfig{RetryInitial: 300 * time.Millisecond, Now: clock})
	if _, err := r.Once(b.ctx); err != nil {
		t.Fatal(err)
	}
	info, _ := outbox.Get(b.ctx, b.db, "flaky", "k")
	if info.State != outbox.StatePending || info.PublishAttempts != 1 || info.LastError == "" {
		t.Fatalf("after a failed publish: %+v", info)
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	if n, _ := r.Once(b.ctx); n != 0 {
		t.Fatalf("the row was claimed again %d time(s) before its backoff passed", n)
	}
	advance(299 * time.Millisecond)
	if n, _ := r.Once(b.ctx); n != 0 {
		t.Fatalf("the row was claimed again %d time(s) 299ms into a 300ms backoff", n)
	}
	advance(time.Millisecond)
	if n, err := r.Once(b.ctx); n != 1 || err != nil {
		t.Fatalf("after the backoff Once = %d, %v", n, err)
	}
	info, _ = outbox.Get(b.ctx, b.db, "flaky", "k")
	if info.State != outbox.StatePublished || info.LastError != "" {
		t.Fatalf("after recovery: %+v", info)
	}
}

func TestRelay_LookaheadKeepsFarTasksPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	b.schedule(t, outbox.Task{Topic: "hz", Key: "soon", DueAt: time.Now().Add(time.Minute)})
	b.schedule(t, outbox.Task{Topic: "hz", Key: "next-week", DueAt: time.Now().Add(7 * 24 * time.Hour)})
	if n, err := newRelay(t, b, mem, outbox.RelayConfig{Lookahead: time.Hour}).Once(b.ctx); n != 1 || err != nil {
		t.Fatalf("Once = %d, %v; want only the task within the lookahead", n, err)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "hz", "next-week"); info.State != outbox.StatePending {
		t.Fatalf("far task is %s, want pending", info.State)
	}
}

func TestRelay_NudgeWakesAnIdleRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	r := newRelay(t, b, mem, outbox.RelayConfig{Workers: 1, IdleMin: time.Hour, IdleMax: time.Hour})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	time.Sleep(100 * time.Millisecond) // the first empty claim puts it to sleep for an hour
	b.schedule(t, outbox.Task{Topic: "nudge", Key: "k", DueAt: time.Now()})
	r.Nudge()
	if !testutil.Eventually(10*time.Second, 10*time.Millisecond, func() bool { return b.count(t, "state = 'published'") > 0 }) {
		t.Fatal("the nudged relay did not publish")
	}
	cancel()
	<-done
}

func TestRelay_DefaultLookaheadComesFromTheBrokerAndKeepsLaterTasksInTheDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{Limits: broker.Limits{Lookahead: time.Minute}})
	t.Cleanup(func() { _ = mem.Close() })
	now := time.Now()
	b.schedule(t, outbox.Task{Topic: "la", Key: "inside", DueAt: now.Add(30 * time.Second)})
	b.schedule(t, outbox.Task{Topic: "la", Key: "cancelled", DueAt: now.Add(10 * time.Minute)})
	b.schedule(t, outbox.Task{Topic: "la", Key: "moved-in", DueAt: now.Add(time.Hour)})
	b.schedule(t, outbox.Task{Topic: "la", Key: "moved-out", DueAt: now.Add(20 * time.Second)})
	relay := newRelay(t, b, mem, outbox.RelayConfig{}) // no Lookahead: the broker's minute
	// Before the first claim a payment cancels one task and two are moved
	// across the window, one in, one out.
	if err := outbox.Cancel(b.ctx, b.db, "la", "cancelled"); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Reschedule(b.ctx, b.db, "la", "moved-in", now.Add(40*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Reschedule(b.ctx, b.db, "la", "moved-out", now.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n, err := relay.Once(b.ctx); n != 2 || err != nil {
		t.Fatalf("Once = %d, %v; want the two tasks due within the minute", n, err)
	}
	want := map[string]outbox.State{"inside": outbox.StatePublished, "moved-in": outbox.StatePublished,
		"cancelled": outbox.StateCancelled, "moved-out": outbox.StatePending}
	for key, st := range want {
		if info, err := outbox.Get(b.ctx, b.db, "la", key); err != nil || info.State != st {
			t.Errorf("%s: %+v, %v; want %s", key, info, err, st)
		}
	}
	// The cancelled task never reached the broker: only two messages did.
	if got := mem.Stats().Published; got != 2 {
		t.Errorf("broker stored %d messages, want 2: a task cancelled before its lookahead costs the broker nothing", got)
	}
	// Scheduled inside the window, a task goes out with the next claim.
	b.schedule(t, outbox.Task{Topic: "la", Key: "late-comer", DueAt: time.Now().Add(5 * time.Second)})
	if n, err := relay.Once(b.ctx); n != 1 || err != nil {
		t.Fatalf("Once = %d, %v; want the task scheduled inside the window", n, err)
	}
}

// The relay runs as many claim loops as its broker advises (RocketMQ's
// timed sends wait on the broker's store, so it asks for more), its own
// default without advice, and what it was told above both.
func TestNewRelay_WorkersFollowTheBrokersAdvice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		advice, set, want int
	}{
		{advice: 6, want: 6},
		{advice: 0, want: outbox.DefaultWorkers},
		{advice: 6, set: 2, want: 2},
	} {
		mem := memory.New(memory.Config{Limits: broker.Limits{RelayWorkers: tc.advice}})
		relay, err := outbox.NewRelay(b.db, mem, outbox.RelayConfig{Workers: tc.set})
		_ = mem.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := relay.Workers(); got != tc.want {
			t.Errorf("advice %d, Workers %d: the relay runs %d loops, want %d", tc.advice, tc.set, got, tc.want)
		}
	}
}

func TestNewRelay_RefusesALookaheadItCannotKeep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{Limits: broker.Limits{MaxHop: time.Hour}})
	t.Cleanup(func() { _ = mem.Close() })
	for _, tc := range []struct {
		cfg  outbox.RelayConfig
		want string
	}{
		{outbox.RelayConfig{Lookahead: 60 * time.Millisecond}, "shorter than the relay's ProbeMax 80ms, so tasks would reach the broker after they are due; raise Lookahead to at least 80ms or lower ProbeMax"},
		{outbox.RelayConfig{Probe: 50 * time.Millisecond, ProbeMax: 20 * time.Millisecond}, "ProbeMax 20ms is shorter than Probe 50ms"},
		{outbox.RelayConfig{Lookahead: 500 * time.Millisecond, Probe: -1, IdleMax: time.Second}, "shorter than the relay's IdleMax"},
		{outbox.RelayConfig{Lookahead: 2 * time.Hour}, "longer than one broker hop (1h0m0s), so every task published that early would hop twice; lower Lookahead to at most 1h0m0s"},
	} {
		_, err := outbox.NewRelay(b.db, mem, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewRelay(%+v) = %v; want an error saying %q", tc.cfg, err, tc.want)
		}
	}
	// Negative is every pending row at once, whatever the broker advises.
	if _, err := outbox.NewRelay(b.db, mem, outbox.RelayConfig{Lookahead: -1}); err != nil {
		t.Errorf("Lookahead -1: %v", err)
	}
}

// A relay publishing ahead claims what comes into its window in paced
// batches, not row by row as it arrives, and a task due sooner than two
// paces still wakes it at once and reaches the broker before it is due.
func TestRelay_PacedClaimsBatchTheWindowAndUrgentTasksStillGoAtOnce(t *testing.T) {
	t.Parallel()
	const pace = 4 * time.Second
	b := setup(t)
	mem := memory.New(memory.Config{Limits: broker.Limits{Lookahead: 20 * time.Second}})
	t.Cleanup(func() { _ = mem.Close() })
	var batches atomic.Int64
	r := newRelay(t, b, mem, outbox.RelayConfig{Workers: 1, Pace: pace, Hooks: outbox.RelayHooks{Published: func(int, time.Duration) { batches.Add(1) }}})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after 20s: %s", what)
			}
		}
	}
	// 20 tasks due 18 s out (inside the 20 s window, and not urgent until
	// they have waited 10 s), one every 75 ms and however long each commit
	// takes. A paced relay's claims that find rows come at least a pace
	// apart, and all but the last begin before the last row arrives, so
	// rows arriving over span take at most span/pace + 2 batches (2 when
	// they all arrive within one pace). A relay claiming rows as they come
	// takes about 20.
	first := time.Now()
	for i := range 20 {
		b.schedule(t, outbox.Task{Topic: "pace", Key: fmt.Sprintf("ahead-%d", i), DueAt: time.Now().Add(18 * time.Second)})
		time.Sleep(75 * time.Millisecond)
	}
	span := time.Since(first)
	waitFor("20 tasks published", func() bool { return b.count(t, "state = 'published'") == 20 })
	if n, most := batches.Load(), int64(span/pace)+2; n > most {
		t.Fatalf("%d publish batches for 20 tasks arriving over %v, want at most %d: the relay claimed them as they came instead of at its pace", n, span.Round(time.Millisecond), most)
	}
	// The last of them was just published, so the loop waits a pace (4 s)
	// from that claim before it claims again. A task due in 2 s, scheduled by another
	// process (no Nudge), is in the broker before it is due only if the
	// probe wakes the loop for it.
	due := time.Now().Add(2 * time.Second)
	b.schedule(t, outbox.Task{Topic: "pace", Key: "urgent", DueAt: due})
	waitFor("the urgent task published", func() bool { return b.count(t, "task_key = 'urgent' AND state = 'published'") == 1 })
	if info, _ := outbox.Get(b.ctx, b.db, "pace", "urgent"); info.PublishedAt.After(due) {
		t.Fatalf("urgent task published at %v, after its due time %v", info.PublishedAt, due)
	}
}

func TestRelay_AnIdleLoopLooksBeforeItClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{Limits: broker.Limits{Lookahead: 10 * time.Second}})
	t.Cleanup(func() { _ = mem.Close() })
	var claims, empty atomic.Int64
	// No probe and a 20 ms idle poll: the loop alone finds the rows.
	r := newRelay(t, b, mem, outbox.RelayConfig{Workers: 1, Probe: -1, IdleMin: 20 * time.Millisecond, IdleMax: 20 * time.Millisecond,
		Hooks: outbox.RelayHooks{Claimed: func(n int) {
			claims.Add(1)
			if n == 0 {
				empty.Add(1)
			}
		}}})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	// A second of nothing to do is about 50 polls; only the first claims.
	time.Sleep(time.Second)
	if n := empty.Load(); n > 1 {
		t.Fatalf("%d empty claims in an idle second: the loop claimed at each poll instead of looking first", n)
	}
	// A row another process schedules (no Nudge) is seen by the look and
	// claimed: due in 8 s, inside the lookahead.
	b.schedule(t, outbox.Task{Topic: "look", Key: "k", DueAt: time.Now().Add(8 * time.Second)})
	if !testutil.Eventually(5*time.Second, 20*time.Millisecond, func() bool { return b.count(t, "task_key = 'k' AND state = 'published'") == 1 }) {
		t.Fatal("after 5s: the task is not published")
	}
	if n := claims.Load() - empty.Load(); n != 1 {
		t.Fatalf("%d claims took rows, want 1", n)
	}
}

// overlapPublisher records how its publishes follow each other once the
// first `warm` have ended: late is the most ever in flight together, and
// gap the shortest pause between one ending and the next starting with
// none in flight (-1 until there is one).
type overlapPublisher struct {
	broker.Publisher
	hold time.Duration
	warm int

	mu              sync.Mutex
	ended, inFlight int
	late            int
	lastEnd         time.Time
	gap             time.Duration
}

func (p *overlapPublisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	p.mu.Lock()
	p.inFlight++
	if p.ended >= p.warm {
		p.late = max(p.late, p.inFlight)
		if p.inFlight == 1 && p.ended > p.warm {
			if g := time.Since(p.lastEnd); p.gap < 0 || g < p.gap {
				p.gap = g
			}
		}
	}
	p.mu.Unlock()
	time.Sleep(p.hold)
	err := p.Publisher.Publish(ctx, msgs...)
	p.mu.Lock()
	p.inFlight--
	p.ended++
	p.lastEnd = time.Now()
	p.mu.Unlock()
	return err
}

func (p *overlapPublisher) overlap() (late int, gap time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.late, p.gap
}

// consumersBusy gives consumers work due now: a task in the broker (state
// published) that came due a second ago. A relay ahead of due rests
// between batches only then (Relay.handling).
func (b *bundle) consumersBusy(t *testing.T) {
	t.Helper()
	id := b.schedule(t, outbox.Task{Topic: "busy", Key: "handling", DueAt: time.Now().Add(-time.Second)})
	if _, err := b.db.ExecContext(b.ctx, "UPDATE delay_task SET state = 'published', published_ms = ? WHERE id = ?", time.Now().UnixMilli(), id); err != nil {
		t.Fatal(err)
	}
}

func TestRelay_AheadOfDueOneLoopClaimsAndRestsBehindEveryLoopClaims(t *testing.T) {
	t.Parallel()
	const hold = 50 * time.Millisecond // each publish
	for _, c := range []struct {
		name     string
		due      time.Duration // from now
		handling bool          // a published task is past due: consumers have work
		want     func(late int, gap time.Duration) bool
		why      string
	}{
		// Lookahead 1 min: rows due in 50 s are further off than half
		// of it for 20 s, several times what the resting drain takes
		// even on a loaded machine (about 2 s unloaded). While consumers have
		// due work, one loop at a time, and after each full batch it
		// rests at least as long as the batch took, publish included.
		{"ahead", 50 * time.Second, true, func(late int, gap time.Duration) bool { return late == 1 && gap >= hold },
			"claims far from due ran side by side, or followed each other without a rest"},
		// The same rows with nothing due: the relay delays no consumer,
		// and every loop claims.
		{"ahead, nothing due", 50 * time.Second, false, func(late int, _ time.Duration) bool { return late > 1 },
			"with nothing due, claims far from due were made one loop at a time"},
		// Rows already due: every loop claims.
		{"behind", -time.Second, false, func(late int, _ time.Duration) bool { return late > 1 }, "overdue rows were claimed one loop at a time"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			mem := memory.New(memory.Config{Limits: broker.Limits{Lookahead: time.Minute}})
			t.Cleanup(func() { _ = mem.Close() })
			tasks := make([]outbox.Task, 2000)
			due := time.Now().Add(c.due)
			for i := range tasks {
				tasks[i] = outbox.Task{Topic: "overlap", Key: fmt.Sprintf("k-%d", i), DueAt: due}
			}
			if err := outbox.ScheduleMany(b.ctx, b.db, tasks); err != nil {
				t.Fatal(err)
			}
			if c.handling {
				b.consumersBusy(t)
			}
			// 20 batches of 100 for 4 loops. The loops start knowing
			// nothing, so the first four claims may overlap whatever the
			// due times; what follows them is measured.
			pub := &overlapPublisher{Publisher: mem, hold: hold, warm: 4, gap: -1}
			r := newRelay(t, b, pub, outbox.RelayConfig{Workers: 4, BatchSize: 100})
			ctx, cancel := context.WithCancel(b.ctx)
			done := make(chan struct{})
			go func() { _ = r.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			published := func() int { return b.count(t, "state = 'published' AND topic = 'overlap'") }
			if !testutil.Eventually(30*time.Second, 20*time.Millisecond, func() bool { return published() == len(tasks) }) {
				t.Fatalf("after 30s: %d of %d published", published(), len(tasks))
			}
			if late, gap := pub.overlap(); !c.want(late, gap) {
				t.Fatalf("after the first claims: at most %d publishes in flight together, the shortest pause between them %v: %s", late, gap, c.why)
			}
		})
	}
}

// A relay draining a backlog claims each batch past the last one (the
// rows before it are still being published), yet a row that becomes
// claimable before that point while it drains is taken long before the
// drain ends: found by the probe when it is due soon, after a Nudge when
// this process scheduled it, and by the rescan a pace later otherwise.
func TestRelay_DrainingPastItsLastBatchStillTakesRowsThatComeBeforeIt(t *testing.T) {
	t.Parallel()
	// The lookahead is a minute and the backlog due 50 s out: the relay
	// is ahead (the rows further off than half the lookahead), so one loop
	// claims at a time and rests, for 20 s, several times what the drain
	// takes even on a loaded machine (about 4 s unloaded). A relay that stopped
	// being ahead mid-drain would finish the drain at full speed, perhaps
	// before the row scheduled mid-drain is published.
	for _, c := range []struct {
		name  string
		pace  time.Duration // the rescan is a pace
		probe time.Duration
		nudge bool
		due   time.Duration // of the row scheduled mid-drain, from then
	}{
		// A 12 s rescan (the longest pace a minute's lookahead allows),
		// three times the drain unloaded: only the probe (a row due
		// within urgent(), two paces and a probe) or the Nudge can find
		// the row before the drain ends.
		{"probe", 12 * time.Second, 0, false, time.Second},
		{"nudge", 12 * time.Second, -1, true, time.Second},
		// A 1 s rescan and a row due later than urgent(), the probe off.
		{"rescan", time.Second, -1, false, 4 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			mem := memory.New(memory.Config{Limits: broker.Limits{Lookahead: time.Minute}})
			t.Cleanup(func() { _ = mem.Close() })
			tasks := make([]outbox.Task, 4000)
			due := time.Now().Add(50 * time.Second)
			for i := range tasks {
				tasks[i] = outbox.Task{Topic: "drain", Key: fmt.Sprintf("k-%d", i), DueAt: due}
			}
			if err := outbox.ScheduleMany(b.ctx, b.db, tasks); err != nil {
				t.Fatal(err)
			}
			b.consumersBusy(t) // so the relay, ahead, rests, and the drain lasts
			pub := &countingPublisher{Publisher: &overlapPublisher{Publisher: mem, hold: 50 * time.Millisecond, gap: -1}, seen: map[string]int{}}
			r := newRelay(t, b, pub, outbox.RelayConfig{Workers: 4, BatchSize: 100, Probe: c.probe, Pace: c.pace})
			ctx, cancel := context.WithCancel(b.ctx)
			done := make(chan struct{})
			go func() { _ = r.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()

			if !testutil.Eventually(10*time.Second, 5*time.Millisecond, func() bool { return b.count(t, "topic = 'drain' AND state = 'published'") >= 500 }) {
				t.Fatal("after 10s: the drain has not begun")
			}
			b.schedule(t, outbox.Task{Topic: "drain", Key: "late-comer", DueAt: time.Now().Add(c.due)})
			if c.nudge {
				r.Nudge()
			}
			var left int // backlog rows still pending when the late comer was published
			if !testutil.Eventually(20*time.Second, 5*time.Millisecond, func() bool {
				left = b.count(t, "state = 'pending' AND task_key <> 'late-comer'")
				return b.count(t, "task_key = 'late-comer' AND state = 'published'") == 1
			}) {
				t.Fatal("after 20s: the row scheduled mid-drain is not published")
			}
			if left == 0 {
				t.Fatal("the row scheduled mid-drain was published only once the drain was over")
			}
			if !testutil.Eventually(20*time.Second, 20*time.Millisecond, func() bool { return b.count(t, "topic = 'drain' AND state = 'published'") == len(tasks)+1 }) {
				t.Fatalf("after 20s: %d of %d published", b.count(t, "topic = 'drain' AND state = 'published'"), len(tasks)+1)
			}
			pub.mu.Lock()
			defer pub.mu.Unlock()
			for k, n := range pub.seen {
				if n != 1 {
					t.Fatalf("%s published %d times", k, n)
				}
			}
		})
	}
}

// While the loops drain one topic's backlog, another topic's task due
// after the whole backlog still goes out within about othersEvery, not
// once the drain is through: in due order it would be last.
func TestRelay_AnotherTopicIsNotPublishedBehindOneTopicsBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{Limits: broker.Limits{Lookahead: time.Minute}})
	t.Cleanup(func() { _ = mem.Close() })
	tasks := make([]outbox.Task, 3000)
	due := time.Now().Add(-time.Second)
	for i := range tasks {
		tasks[i] = outbox.Task{Topic: "burst", Key: fmt.Sprintf("k-%d", i), DueAt: due}
	}
	if err := outbox.ScheduleMany(b.ctx, b.db, tasks); err != nil {
		t.Fatal(err)
	}
	// One loop, 100 rows a claim, each publish 50 ms: 30 batches, 1.5 s
	// at least.
	pub := &overlapPublisher{Publisher: mem, hold: 50 * time.Millisecond, gap: -1}
	r := newRelay(t, b, pub, outbox.RelayConfig{Workers: 1, BatchSize: 100, Probe: -1})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if !testutil.Eventually(10*time.Second, 5*time.Millisecond, func() bool { return b.count(t, "topic = 'burst' AND state = 'published'") >= 300 }) {
		t.Fatal("after 10s: the drain has not begun")
	}
	// Due after every row of the backlog, so after all of them in the
	// index the drain walks.
	b.schedule(t, outbox.Task{Topic: "other", Key: "other", DueAt: time.Now().Add(time.Second)})
	r.Nudge()
	var left int // backlog rows still pending when the other topic's went out
	if !testutil.Eventually(20*time.Second, 5*time.Millisecond, func() bool {
		left = b.count(t, "topic = 'burst' AND state = 'pending'")
		return b.count(t, "task_key = 'other' AND state = 'published'") == 1
	}) {
		t.Fatal("after 20s: the other topic's row is not published")
	}
	if left < 500 {
		t.Fatalf("the other topic's row went out with only %d backlog rows left: it waited behind the backlog", left)
	}
}

// RelayConfig.Check refuses, without a database or a broker, what NewRelay
// refuses, so a daemon can check its settings before it connects.
func TestRelayConfigCheck_RefusesWhatNewRelayRefuses(t *testing.T) {
	hop := broker.Limits{MaxHop: time.Minute, Lookahead: 10 * time.Second}
	for _, c := range []struct {
		cfg    outbox.RelayConfig
		limits broker.Limits
		want   string
	}{
		{outbox.RelayConfig{}, broker.Limits{}, ""},
		{outbox.RelayConfig{}, hop, ""},
		{outbox.RelayConfig{Lookahead: 10 * time.Millisecond}, broker.Limits{}, "shorter than the relay's ProbeMax"},
		{outbox.RelayConfig{Lookahead: 2 * time.Minute}, hop, "longer than one broker hop"},
		{outbox.RelayConfig{Lookahead: 2 * time.Minute}, broker.Limits{}, ""}, // the hop is not known yet
		{outbox.RelayConfig{Probe: time.Second, ProbeMax: 100 * time.Millisecond}, broker.Limits{}, "ProbeMax 100ms is shorter than Probe"},
	} {
		err := c.cfg.Check(c.limits)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v on %+v: Check = %v, want %q", c.cfg, c.limits, err, c.want)
		}
	}
}

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
	if got := b.count(t, "task_key = 'confirmed' AND state = 'published'"); got != 1 {
		t.Fatal("the row the broker confirmed is not published")
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

// A claim that cannot record the hand-off publishes nothing and counts
// nothing: the row stays pending and free for the next claim.
func TestRelay_AClaimThatCannotMarkTheHandOffPublishesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, outbox.Task{Topic: "unmarked", Key: "k", DueAt: time.Now()})
	// The database refuses the mark (a lost connection or a full disk, in
	// life): a trigger fails every update to state published.
	if _, err := b.db.ExecContext(b.ctx, `CREATE TRIGGER refuse_published BEFORE UPDATE ON delay_task FOR EACH ROW
BEGIN IF NEW.state = 'published' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF; END`); err != nil {
		t.Fatal(err)
	}
	var published, sent int
	pub := &duringPublish{Publisher: instantPublisher{}, f: func(context.Context) { sent++ }}
	r := newRelay(t, b, pub, outbox.RelayConfig{Hooks: outbox.RelayHooks{Published: func(n int, _ time.Duration) { published += n }}})
	if _, err := r.Once(b.ctx); err == nil || !strings.Contains(err.Error(), "refused by the test") {
		t.Fatalf("Once = %v; want the refused claim", err)
	}
	if published != 0 || sent != 0 {
		t.Fatalf("Published reported %d, %d publishes; want none for a claim that could not mark its rows", published, sent)
	}
	if n := b.count(t, "task_key = 'k' AND state = 'pending' AND lease_owner = 0 AND publish_attempts = 0"); n != 1 {
		t.Fatalf("%d rows pending and free; want the row as it was", n)
	}
}

// MaxRate bounds how fast the relay drains a backlog, across its loops:
// at no moment has it published more than the bound allows since it
// started, and in the end it has published every row.
func TestRelay_MaxRateBoundsTheDrain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	const rows, perSecond = 300, 200.0
	tasks := make([]outbox.Task, rows)
	for i := range tasks {
		tasks[i] = outbox.Task{Topic: "backlog", Key: fmt.Sprint(i), DueAt: time.Now().Add(-time.Minute)}
	}
	if err := outbox.ScheduleMany(b.ctx, b.db, tasks); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []float64{-1, math.NaN(), math.Inf(1)} {
		if _, err := outbox.NewRelay(b.db, mem, outbox.RelayConfig{MaxRate: bad}); err == nil {
			t.Errorf("MaxRate %v accepted", bad)
		}
	}
	var mu sync.Mutex
	var published int
	var over []string
	start := time.Now()
	r := newRelay(t, b, mem, outbox.RelayConfig{MaxRate: perSecond, Workers: 4, Hooks: outbox.RelayHooks{Published: func(n int, _ time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		published += n
		// The burst (a tenth of a second's worth) at once, then the rate.
		if allowed := perSecond/10 + perSecond*time.Since(start).Seconds(); float64(published) > allowed+1 {
			over = append(over, fmt.Sprintf("%d published %v after the start", published, time.Since(start)))
		}
	}}})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	ok := testutil.Eventually(30*time.Second, 20*time.Millisecond, func() bool { return b.count(t, "state = 'published'") == rows })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("%d of %d rows published after 30 s", b.count(t, "state = 'published'"), rows)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(over) > 0 {
		t.Fatalf("the relay went past %v rows a second: %v", perSecond, over)
	}
}

// TopicRates bounds one topic's drain and leaves the others alone: the
// limited topic goes out at its rate while the other's backlog is
// published at once.
func TestRelay_TopicRatesBoundOneTopicAndNotTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	const rows, perSecond = 300, 200.0
	var tasks []outbox.Task
	for i := range rows {
		due := time.Now().Add(-time.Minute)
		tasks = append(tasks, outbox.Task{Topic: "limited", Key: fmt.Sprint(i), DueAt: due}, outbox.Task{Topic: "free", Key: fmt.Sprint(i), DueAt: due})
	}
	if err := outbox.ScheduleMany(b.ctx, b.db, tasks); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []map[string]float64{{"limited": 0}, {"limited": -1}, {"limited": math.NaN()}, {"limited": math.Inf(1)}, {"no spaces": 5}} {
		if _, err := outbox.NewRelay(b.db, mem, outbox.RelayConfig{TopicRates: bad}); err == nil {
			t.Errorf("TopicRates %v accepted", bad)
		}
	}
	pub := &topicClock{Publisher: mem, start: time.Now(), sent: map[string][]time.Duration{}}
	r := newRelay(t, b, pub, outbox.RelayConfig{Workers: 2, TopicRates: map[string]float64{"limited": perSecond}})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	ok := testutil.Eventually(30*time.Second, 20*time.Millisecond, func() bool { return b.count(t, "state = 'published'") == 2*rows })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("%d of %d rows published after 30 s", b.count(t, "state = 'published'"), 2*rows)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	for i, at := range pub.sent["limited"] {
		// A tenth of a second's worth at once, then the rate.
		if allowed := perSecond/10 + perSecond*at.Seconds(); float64(i+1) > allowed+1 {
			t.Fatalf("limited: the %dth row went out %v after the start: past %v a second", i+1, at, perSecond)
		}
	}
	free := pub.sent["free"]
	limited := pub.sent["limited"]
	// 300 limited rows take 1.4 s at least; the free ones all went out
	// before half of them.
	if len(free) != rows || len(limited) != rows {
		t.Fatalf("published free %d, limited %d, want %d each once", len(free), len(limited), rows)
	}
	if free[rows-1] > limited[rows/2] {
		t.Fatalf("the last free row went out %v after the start, the middle limited one at %v: the free topic waited for the limited one",
			free[rows-1], limited[rows/2])
	}
}

// topicClock records when each topic's messages were handed to the broker.
type topicClock struct {
	broker.Publisher
	start time.Time
	mu    sync.Mutex
	sent  map[string][]time.Duration
}

func (p *topicClock) Publish(ctx context.Context, msgs ...*broker.Message) error {
	p.mu.Lock()
	for _, m := range msgs {
		p.sent[m.Topic] = append(p.sent[m.Topic], time.Since(p.start))
	}
	p.mu.Unlock()
	return p.Publisher.Publish(ctx, msgs...)
}
