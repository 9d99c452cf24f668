package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/store"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// duringPublish runs f while the relay's publish is in flight, then lets
// the publish go on, or fails it with fail when set (a confirm lost on
// the way back: the broker may hold the messages all the same).
type duringPublish struct {
	broker.Publisher
	f    func(ctx context.Context)
	fail error
}

func (p *duringPublish) Publish(ctx context.Context, msgs ...*broker.Message) error {
	p.f(ctx)
	if p.fail != nil {
		return p.fail
	}
	return p.Publisher.Publish(ctx, msgs...)
}

// inShortLockWait runs f in a transaction of its own whose lock waits give
// up after one second, as a payment that must not hang would.
func (b *bundle) inShortLockWait(ctx context.Context, f func(q outbox.Querier) error) error {
	conn, err := b.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
		return err
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// The relay holds no row lock while it publishes: a payment that cancels a
// task being published, a reschedule of another and a consumer that
// finishes a third commit at once, and what they did survives the relay's
// bookkeeping after the publish, a failed one included (its undo is
// guarded by the claim's owner, state and generation).
func TestRelay_CancelAndRescheduleWhilePublishingWinAndNeverWait(t *testing.T) {
	t.Parallel()
	for _, fail := range []error{nil, errors.New("connection reset")} {
		t.Run(fmt.Sprintf("publish error %v", fail), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			mem := memory.New(memory.Config{})
			t.Cleanup(func() { _ = mem.Close() })
			b.schedule(t, outbox.Task{Topic: "flight", Key: "paid", DueAt: time.Now()})
			b.schedule(t, outbox.Task{Topic: "flight", Key: "moved", DueAt: time.Now()})
			b.schedule(t, outbox.Task{Topic: "flight", Key: "handled", DueAt: time.Now()})
			b.schedule(t, outbox.Task{Topic: "flight", Key: "plain", DueAt: time.Now()})
			var during []error
			pub := &duringPublish{Publisher: mem, fail: fail, f: func(ctx context.Context) {
				during = append(during,
					b.inShortLockWait(ctx, func(q outbox.Querier) error { return outbox.Cancel(ctx, q, "flight", "paid") }),
					b.inShortLockWait(ctx, func(q outbox.Querier) error {
						return outbox.Reschedule(ctx, q, "flight", "moved", time.Now().Add(time.Hour))
					}),
					b.inShortLockWait(ctx, func(q outbox.Querier) error {
						_, err := q.ExecContext(ctx, "UPDATE delay_task SET state = 'done' WHERE task_key = 'handled'")
						return err
					}))
			}}
			if n, err := newRelay(t, b, pub, outbox.RelayConfig{}).Once(b.ctx); err != nil || n != 4 {
				t.Fatalf("Once = %d, %v", n, err)
			}
			for _, err := range during {
				if err != nil {
					t.Fatalf("a business transaction during the publish failed: %v", err)
				}
			}
			plain := outbox.StatePublished
			if fail != nil {
				plain = outbox.StatePending
			}
			for key, want := range map[string]outbox.State{"paid": outbox.StateCancelled, "moved": outbox.StatePending, "handled": outbox.StateDone, "plain": plain} {
				info, err := outbox.Get(b.ctx, b.db, "flight", key)
				if err != nil {
					t.Fatal(err)
				}
				if info.State != want {
					t.Errorf("%s: state %s after the relay recorded its publish, want %s", key, info.State, want)
				}
				if key == "moved" && (info.Generation != 1 || !info.PublishedAt.IsZero() || info.LastError != "") {
					t.Errorf("moved: generation %d, published at %v, last error %q; the reschedule must win", info.Generation, info.PublishedAt, info.LastError)
				}
			}
		})
	}
}

// A relay's claim whose lease expired (its relay hung) records nothing
// over the scanner's rescue that took the row next: the row stays
// published, the rescue counted.
func TestRelay_ExpiredClaimCannotOverwriteTheScannersRescue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	due := time.Now().Add(-time.Millisecond)
	b.schedule(t, outbox.Task{Topic: "lease", Key: "k", DueAt: due})
	now := time.Now()
	hung, err := store.ClaimLeased(b.ctx, b.db, store.ClaimSpec{State: store.Pending, DueAtMost: now.UnixMilli(), ReadyAtMost: now.UnixMilli(),
		PublishedAtMost: 1<<63 - 1, Limit: 10, Owner: 1, LeaseUntil: now.Add(time.Minute).UnixMilli(), HandOffAt: now.UnixMilli()})
	if err != nil || len(hung) != 1 {
		t.Fatalf("relay claim: %d rows, %v", len(hung), err)
	}
	later := now.Add(2 * time.Minute).UnixMilli()
	rescue, err := store.ClaimLeased(b.ctx, b.db, store.ClaimSpec{State: store.Published, DueAtMost: later, ReadyAtMost: later,
		PublishedAtMost: later, Limit: 10, Owner: 2, LeaseUntil: later + 60000})
	if err != nil || len(rescue) != 1 {
		t.Fatalf("scanner claim after the lease: %d rows, %v", len(rescue), err)
	}
	// The hung relay wakes up and records a failure; the scanner then
	// records its rescue.
	if n, err := store.MarkHandOffFailed(b.ctx, b.db, 1, hung, time.Now().UnixMilli(), time.Hour, time.Hour, "publish failed: late"); err != nil || n != 0 {
		t.Fatalf("the expired claim changed %d rows (%v), want 0", n, err)
	}
	if n, err := store.MarkRescued(b.ctx, b.db, 2, rescue, time.Now().UnixMilli(), 10*time.Second, time.Hour); err != nil || n != 1 {
		t.Fatalf("the scanner recorded %d rescues (%v), want 1", n, err)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "lease", "k"); info.State != outbox.StatePublished || info.LastError != "" || info.Rescues != 1 {
		t.Fatalf("after both: state %s, last error %q, %d rescues", info.State, info.LastError, info.Rescues)
	}
}

// A broker that hangs fails the batch at PublishTimeout; the rows back off
// and nothing stays locked.
func TestRelay_HungBrokerFailsTheBatchAtPublishTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, outbox.Task{Topic: "hung", Key: "k", DueAt: time.Now()})
	hang := &duringPublish{Publisher: memory.New(memory.Config{}), f: func(ctx context.Context) { <-ctx.Done() }}
	start := time.Now()
	if _, err := newRelay(t, b, hang, outbox.RelayConfig{PublishTimeout: 200 * time.Millisecond}).Once(b.ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Once took %v with a 200ms publish timeout", took)
	}
	if got := b.count(t, "state = 'pending' AND lease_owner = 0 AND publish_attempts = 1 AND last_error LIKE 'publish failed:%'"); got != 1 {
		t.Fatalf("%d rows recorded the failure, want 1", got)
	}
	if err := b.inShortLockWait(b.ctx, func(q outbox.Querier) error { return outbox.Cancel(b.ctx, q, "hung", "k") }); err != nil {
		t.Fatalf("cancel after a hung publish: %v", err)
	}
}

// goodAndInvalid schedules a valid task ("good") and writes by hand one no
// broker can carry ("epoch": due_ms 0), both of topic "hand".
func goodAndInvalid(t *testing.T, b *bundle) {
	t.Helper()
	b.schedule(t, outbox.Task{Topic: "hand", Key: "good", DueAt: time.Now()})
	if _, err := b.db.Exec(`INSERT INTO delay_task (topic, task_key, due_ms, payload, state, created_ms, updated_ms)
VALUES ('hand', 'epoch', 0, '', 'pending', 0, 0)`); err != nil {
		t.Fatal(err)
	}
}

// A row written by hand that no broker can carry goes dead with its reason
// and does not hold up the valid rows claimed with it.
func TestRelay_RowNoBrokerCanCarryGoesDeadWithoutBlockingOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	goodAndInvalid(t, b)
	if n, err := newRelay(t, b, mem, outbox.RelayConfig{}).Once(b.ctx); err != nil || n != 2 {
		t.Fatalf("Once = %d, %v", n, err)
	}
	if got := b.count(t, "task_key = 'epoch' AND state = 'dead' AND last_error LIKE 'invalid row: %'"); got != 1 {
		t.Fatal("the row with due_ms 0 is not dead with its reason")
	}
	if got := b.count(t, "task_key = 'good' AND state = 'published'"); got != 1 {
		t.Fatal("the valid row beside it was not published")
	}
}

// When marking an invalid row dead fails, the valid rows claimed with it
// are published all the same, and Once reports the failure. (Returning at
// the failure left them leased and unpublished for a whole lease.) The
// invalid row goes back to pending, free, for the next claim to mark dead:
// left published, the scanner would take it to the broker. The scratch
// database refuses the dead mark through a trigger.
func TestRelay_ValidRowsGoOutWhenMarkingAnInvalidOneDeadFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	goodAndInvalid(t, b)
	if _, err := b.db.Exec(`CREATE TRIGGER refuse_dead BEFORE UPDATE ON delay_task FOR EACH ROW
IF NEW.state = 'dead' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'dead refused by the test'; END IF`); err != nil {
		t.Fatal(err)
	}
	n, err := newRelay(t, b, mem, outbox.RelayConfig{}).Once(b.ctx)
	if n != 2 || err == nil || !strings.Contains(err.Error(), "dead refused by the test") {
		t.Fatalf("Once = %d, %v; want both rows claimed and the refused mark reported", n, err)
	}
	if got := b.count(t, "task_key = 'good' AND state = 'published'"); got != 1 {
		t.Fatal("the valid row was not published beside the invalid one")
	}
	if got := b.count(t, "task_key = 'epoch' AND state = 'pending' AND lease_owner = 0 AND published_ms = 0"); got != 1 {
		t.Fatal("the invalid row is not back to pending for the next claim")
	}
}

// A claim holds at most MaxBatchBytes of payloads, and always one row, so
// a row larger than the budget still goes out.
func TestRelay_ClaimStopsAtItsByteBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	for i := range 5 {
		b.schedule(t, outbox.Task{Topic: "bytes", Key: fmt.Sprint(i), DueAt: time.Now().Add(time.Duration(i-10) * time.Second), Payload: make([]byte, 100<<10)})
	}
	r := newRelay(t, b, mem, outbox.RelayConfig{MaxBatchBytes: 250 << 10})
	for _, want := range []int{2, 2, 1} {
		if n, err := r.Once(b.ctx); err != nil || n != want {
			t.Fatalf("Once = %d, %v; want %d rows of 100 KiB under a 250 KiB budget", n, err, want)
		}
	}
	b.schedule(t, outbox.Task{Topic: "bytes", Key: "big", DueAt: time.Now(), Payload: make([]byte, 200<<10)})
	small := newRelay(t, b, mem, outbox.RelayConfig{MaxBatchBytes: 150 << 10})
	if n, err := small.Once(b.ctx); err != nil || n != 1 {
		t.Fatalf("a row over the budget: Once = %d, %v; want it alone", n, err)
	}
	if got := b.count(t, "topic = 'bytes' AND state = 'published' AND LENGTH(payload) >= 100 * 1024"); got != 6 {
		t.Fatalf("%d rows published with their payloads, want 6", got)
	}
}

// An idle relay whose own claims have backed off far notices, through its
// probe, a row another process scheduled, and publishes it.
func TestRelay_ProbeWakesAnIdleRelayForARowScheduledElsewhere(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	for _, probe := range []time.Duration{-1, 20 * time.Millisecond} {
		var claims atomic.Int64
		r := newRelay(t, b, mem, outbox.RelayConfig{IdleMin: time.Hour, IdleMax: time.Hour, Probe: probe,
			Hooks: outbox.RelayHooks{Claimed: func(int) { claims.Add(1) }}})
		ctx, cancel := context.WithCancel(b.ctx)
		done := make(chan struct{})
		go func() { _ = r.Run(ctx); close(done) }()
		// Each loop claims once as it starts, finds nothing and sleeps for
		// an hour. The row is scheduled only after every loop's first
		// claim, or a loop that started late would take it without the
		// probe.
		if !testutil.Eventually(10*time.Second, 5*time.Millisecond, func() bool { return claims.Load() >= int64(r.Workers()) }) {
			t.Fatalf("probe %v: after 10s, %d of the %d loops made their first claim", probe, claims.Load(), r.Workers())
		}
		key := fmt.Sprintf("elsewhere-%v", probe > 0)
		b.schedule(t, outbox.Task{Topic: "probe", Key: key, DueAt: time.Now()})
		// With the probe, the row is published within about 20 ms; 10 s
		// leaves room for a loaded machine. Without it, the loops sleep for
		// an hour, and 3 s shows that nothing else takes the row.
		wait := 3 * time.Second
		if probe > 0 {
			wait = 10 * time.Second
		}
		published := testutil.Eventually(wait, 20*time.Millisecond, func() bool {
			return b.count(t, "task_key = ? AND state = 'published'", key) == 1
		})
		cancel()
		<-done
		if published != (probe > 0) {
			t.Fatalf("probe %v: published within %v = %v", probe, wait, published)
		}
	}
}

// A quiet relay's probe looks less often, and a Nudge puts it back at
// Probe. Looks are counted as the SELECTs of the relay's only connection:
// with IdleMax an hour, the claim loops run only when woken.
func TestRelay_AQuietProbeSlowsDownAndANudgeSpeedsItUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.SetMaxOpenConns(1)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	r := newRelay(t, b, mem, outbox.RelayConfig{IdleMin: time.Hour, IdleMax: time.Hour, Probe: 2 * time.Millisecond, ProbeMax: time.Second})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	selects := func() int {
		var name string
		var n int
		if err := b.db.QueryRowContext(b.ctx, "SHOW SESSION STATUS LIKE 'Com_select'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// looks counts SELECTs over d while nudge, if set, runs every 200 ms:
	// often enough to keep a 2 ms probe from ever counting as quiet.
	looks := func(d time.Duration, nudge bool) int {
		before := selects()
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			if nudge {
				r.Nudge()
			}
			time.Sleep(min(200*time.Millisecond, time.Until(end)))
		}
		return selects() - before
	}

	// ProbeQuietLooks looks at 2 ms and more, then waits of 4 ms doubling
	// to 1 s: about 3 s, more on a loaded machine.
	var n int
	if !testutil.Eventually(30*time.Second, 0, func() bool {
		n = looks(time.Second, false)
		return n <= 5
	}) {
		t.Fatalf("quiet for 30s: still %d SELECTs a second, want a probe slowed to about one look a second", n)
	}
	// The first Nudge takes at most the slowest wait (1 s) to reach the
	// probe; then each look comes 2 ms after the last. The Nudges' own
	// claims are 5 a second.
	looks(1500*time.Millisecond, true)
	n = looks(time.Second, true)
	t.Logf("nudged: %d SELECTs in 1s", n)
	if n < 30 {
		t.Fatalf("nudged every 200 ms: %d SELECTs in 1s, want a probe back at 2 ms (hundreds)", n)
	}
}

// A message the consumer failed while the relay was still publishing (a
// task due at once on a fast broker) keeps its retry's wait, and the row
// is the consumer's from then on: no lease, so a failure the relay records
// afterwards (a confirm lost on the way back) cannot put the row back to
// pending and publish it before its backoff ended.
func TestRelay_LeavesARetryRecordedBeforeItsPublishRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	id := b.schedule(t, outbox.Task{Topic: "flight", Key: "quick", DueAt: time.Now()})
	retryAt := broker.MillisUTC(time.Now().Add(time.Hour))
	var recorded error
	// The publish reports a failure after the consumer's retry: the
	// relay's undo must leave the row to the consumer.
	pub := &duringPublish{Publisher: mem, fail: errors.New("confirm lost"), f: func(ctx context.Context) {
		info, err := outbox.Get(ctx, b.db, "flight", "quick")
		if err != nil {
			recorded = err
			return
		}
		recorded = outbox.RecordRetry(b.db)(ctx, &broker.Message{TaskID: id, Topic: "flight", Key: "quick",
			Generation: info.Generation, Attempt: 1, DeliverAt: retryAt}, errors.New("handler failed"))
	}}
	if n, err := newRelay(t, b, pub, outbox.RelayConfig{}).Once(b.ctx); err != nil || n != 1 {
		t.Fatalf("Once = %d, %v", n, err)
	}
	if recorded != nil {
		t.Fatal(recorded)
	}
	var state string
	var next, owner int64
	if err := b.db.QueryRow("SELECT state, next_attempt_ms, lease_owner FROM delay_task WHERE id = ?", id).Scan(&state, &next, &owner); err != nil {
		t.Fatal(err)
	}
	if state != "published" || next != retryAt.UnixMilli() || owner != 0 {
		t.Fatalf("row is %s, next attempt at %d, lease owner %d; want published, %d (the retry's), 0", state, next, owner, retryAt.UnixMilli())
	}
}
