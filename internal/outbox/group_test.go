package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// cancelOne is the order-timeout handler as users write it: one message.
func cancelOne(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
	return cancelOrder(m.Key)(ctx, tx)
}

func TestHandleGroup_RunsLiveTasksOnceAndReportsTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live1 := b.order(t, "live-1", time.Now().Add(-time.Millisecond))
	live2 := b.order(t, "live-2", time.Now().Add(-time.Millisecond))
	done := b.order(t, "done", time.Now().Add(-time.Millisecond))
	if _, err := outbox.Handle(b.ctx, b.db, done, cancelOrder("done")); err != nil {
		t.Fatal(err)
	}
	cancelled := b.order(t, "cancelled", time.Now().Add(-time.Millisecond))
	if err := outbox.Cancel(b.ctx, b.db, "order-cancel", "cancelled"); err != nil {
		t.Fatal(err)
	}
	stale := b.order(t, "stale", time.Now().Add(-time.Millisecond))
	if err := outbox.Reschedule(b.ctx, b.db, "order-cancel", "stale", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	missing := &broker.Message{TaskID: 999999, Topic: "order-cancel", Key: "missing", DeliverAt: time.Now()}
	byKey := *b.order(t, "by-key", time.Now().Add(-time.Millisecond))
	byKey.TaskID = 0
	dup := *live1
	var got []string
	out, errs, err := outbox.HandleGroup(b.ctx, b.db, []*broker.Message{live1, done, cancelled, stale, missing, &dup, live2, &byKey},
		func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
			got = append(got, m.Key)
			return cancelOne(ctx, tx, m)
		})
	if err != nil {
		t.Fatal(err)
	}
	want := []outbox.HandleResult{outbox.Handled, outbox.SkippedDone, outbox.SkippedCancelled, outbox.SkippedStale, outbox.SkippedMissing, outbox.SkippedDone, outbox.Handled, outbox.Handled}
	for i := range want {
		if out[i] != want[i] || errs[i] != nil {
			t.Errorf("message %d: %v, %v; want %v", i, out[i], errs[i], want[i])
		}
	}
	if strings.Join(got, ",") != "live-1,live-2,by-key" {
		t.Fatalf("fn saw %v, want each live task once", got)
	}
	for _, id := range []string{"live-1", "live-2", "by-key"} {
		if status, cancels := b.orderRow(t, id); status != "CANCELLED" || cancels != 1 {
			t.Errorf("%s: %s with %d cancels", id, status, cancels)
		}
		if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", id); info.State != outbox.StateDone {
			t.Errorf("%s task is %s", id, info.State)
		}
	}
	for _, id := range []string{"cancelled", "stale"} {
		if status, _ := b.orderRow(t, id); status != "UNPAID" {
			t.Errorf("%s: order %s, want UNPAID: a skipped task's handler ran", id, status)
		}
	}
}

// A message whose handler fails is rolled back to its savepoint alone: its
// partial writes vanish, its task stays open, and the rest of the group
// commits.
func TestHandleGroup_AFailingMessageIsRolledBackAloneAndTheOthersCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, poison, c := b.order(t, "a", time.Now().Add(-time.Millisecond)), b.order(t, "poison", time.Now().Add(-time.Millisecond)), b.order(t, "c", time.Now().Add(-time.Millisecond))
	boom := errors.New("payment service down")
	_, errs, err := outbox.HandleGroup(b.ctx, b.db, []*broker.Message{a, poison, c}, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		if err := cancelOne(ctx, tx, m); err != nil {
			return err
		}
		if m.Key == "poison" {
			return boom // after its write: the savepoint must undo it
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(errs[1], boom) || errs[0] != nil || errs[2] != nil {
		t.Fatalf("errs = %v, want only the poison message's", errs)
	}
	if status, cancels := b.orderRow(t, "poison"); status != "UNPAID" || cancels != 0 {
		t.Fatalf("the failed message's write survived: %s, %d cancels", status, cancels)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", "poison"); info.State != outbox.StatePending {
		t.Fatalf("the failed message's task is %s, want still pending", info.State)
	}
	for _, id := range []string{"a", "c"} {
		if status, cancels := b.orderRow(t, id); status != "CANCELLED" || cancels != 1 {
			t.Errorf("%s: %s with %d cancels, want cancelled once beside the failure", id, status, cancels)
		}
	}
}

// A handler that panics fails its own message as an error would, in the
// group's first run (the group runs again without it) and inside a
// savepoint on the rerun: the others commit, and neither panicking
// message's write survives. Without the recover the panic left
// HandleGroup, and the consumer ran the whole group one at a time.
func TestHandleGroup_APanickingHandlerFailsOnlyItsMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, poison, c := b.order(t, "a", time.Now().Add(-time.Millisecond)), b.order(t, "poison", time.Now().Add(-time.Millisecond)), b.order(t, "c", time.Now().Add(-time.Millisecond))
	runs := map[string]int{}
	_, errs, err := outbox.HandleGroup(b.ctx, b.db, []*broker.Message{a, poison, c}, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		runs[m.Key]++
		if err := cancelOne(ctx, tx, m); err != nil {
			return err
		}
		// c first runs in the rerun (the first run stops at poison),
		// inside its savepoint.
		if m.Key == "poison" || m.Key == "c" {
			panic("nil map in " + m.Key) // after its write
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the group failed whole: %v", err)
	}
	if errs[0] != nil || errs[1] == nil || errs[2] == nil || !strings.Contains(errs[1].Error(), "panicked: nil map in poison") || !strings.Contains(errs[2].Error(), "panicked: nil map in c") {
		t.Fatalf("errs = %v, want a's nil and the two panics", errs)
	}
	for _, id := range []string{"poison", "c"} {
		if status, cancels := b.orderRow(t, id); status != "UNPAID" || cancels != 0 {
			t.Errorf("%s: the panicking message's write survived: %s, %d cancels", id, status, cancels)
		}
	}
	if status, cancels := b.orderRow(t, "a"); status != "CANCELLED" || cancels != 1 {
		t.Errorf("a: %s with %d cancels, want cancelled once beside the panics", status, cancels)
	}
	if runs["poison"] != 1 || runs["c"] != 1 || runs["a"] != 2 {
		t.Errorf("runs %v, want poison and c once, a twice (the rolled-back first run and the rerun)", runs)
	}
}

// In a group, a task not due by the database's clock is reported early and
// not run; the others are.
func TestHandleGroup_ATaskNotDueByTheDatabaseClockWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now, later := b.order(t, "now", time.Now().Add(-time.Millisecond)), b.order(t, "later", time.Now().Add(time.Hour))
	later.DeliverAt = time.Now() // the message claims it is due
	_, errs, err := outbox.HandleGroup(b.ctx, b.db, []*broker.Message{now, later}, cancelOne)
	var early *broker.EarlyError
	if err != nil || errs[0] != nil || !errors.As(errs[1], &early) {
		t.Fatalf("HandleGroup = %v, %v; want the second early", errs, err)
	}
	if status, _ := b.orderRow(t, "later"); status != "UNPAID" {
		t.Fatal("a task due in an hour ran")
	}
}

// The consumer from outbox.NewConsumer groups a burst of due tasks into
// shared transactions without being told to, and with a poison message, a
// message that fails once, a cancelled task and duplicates in the burst,
// every effect happens exactly once.
func TestNewConsumer_GroupsABurstAndIsolatesEachMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{Prefetch: 500})
	t.Cleanup(func() { _ = mem.Close() })
	const n = 300
	due := time.Now().Add(500 * time.Millisecond)
	for i := range n {
		b.order(t, fmt.Sprintf("g-%d", i), due)
	}
	if err := outbox.Cancel(b.ctx, b.db, "order-cancel", "g-7"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	relay := newRelay(t, b, mem, outbox.RelayConfig{})
	for b.count(t, "state = 'pending'") > 0 {
		if _, err := relay.Once(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Duplicates of a few messages, as a broker redelivering would send,
	// and a message of the cancelled task, as one published before the
	// cancel would be.
	for _, k := range []string{"g-1", "g-2", "g-3", "g-7"} {
		info, err := outbox.Get(b.ctx, b.db, "order-cancel", k)
		if err != nil {
			t.Fatal(err)
		}
		if err := mem.Publish(ctx, &broker.Message{TaskID: info.ID, Topic: "order-cancel", Key: k, DeliverAt: broker.MillisUTC(due)}); err != nil {
			t.Fatal(err)
		}
	}
	var groups, largest atomic.Int64
	// The effect counts every commit (no status guard), and the poison
	// and the flaky message write it before they fail: an effect applied
	// twice, or a failed message's write kept, shows in cancels.
	var flakyFailed atomic.Bool
	fn := func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		if _, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'CANCELLED', cancels = cancels + 1 WHERE id = ?", m.Key); err != nil {
			return err
		}
		switch {
		case m.Key == "g-5":
			return broker.Permanent(errors.New("poison"))
		case m.Key == "g-9" && flakyFailed.CompareAndSwap(false, true):
			return errors.New("flaky")
		}
		return nil
	}
	group := outbox.Group(b.db, fn)
	var settled atomic.Int64
	c, err := outbox.NewConsumer(b.db, mem, mem, fn, broker.ConsumerConfig{Logger: quiet(), Concurrency: 4,
		Backoff: broker.Backoff{Initial: 50 * time.Millisecond},
		Hooks:   broker.Hooks{Settled: func(string, broker.Outcome, string) { settled.Add(1) }},
		Group: func(ctx context.Context, msgs []*broker.Message) ([]error, error) {
			groups.Add(1)
			if int64(len(msgs)) > largest.Load() {
				largest.Store(int64(len(msgs)))
			}
			return group(ctx, msgs)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, "order-cancel"); err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background()) //nolint:errcheck
	// Every delivery settled: the relay's n-1 (not the cancelled task's),
	// the four published by hand and the flaky message's retry.
	if !testutil.Eventually(30*time.Second, 20*time.Millisecond, func() bool {
		return settled.Load() >= n+4 && b.count(t, "state IN ('pending', 'published')") == 0
	}) {
		t.Fatalf("%d deliveries settled, %d tasks still open", settled.Load(), b.count(t, "state IN ('pending', 'published')"))
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := b.count(t, "state = 'done'"); got != n-2 {
		t.Fatalf("%d tasks done, want %d (all but the cancelled and the poison)", got, n-2)
	}
	if got := b.count(t, "task_key = 'g-5' AND state = 'dead'"); got != 1 {
		t.Fatal("the poison message's task is not dead")
	}
	var once, more int
	if err := b.db.QueryRow("SELECT COUNT(CASE WHEN cancels = 1 THEN 1 END), COUNT(CASE WHEN cancels > 1 THEN 1 END) FROM orders").Scan(&once, &more); err != nil {
		t.Fatal(err)
	}
	if once != n-2 || more != 0 {
		t.Fatalf("%d orders cancelled once and %d more than once; want %d and 0", once, more, n-2)
	}
	for _, k := range []string{"g-5", "g-7"} {
		if status, cancels := b.orderRow(t, k); status != "UNPAID" || cancels != 0 {
			t.Errorf("order %s is %s, cancelled %d times; want UNPAID and 0 (the poison's write rolled back, the cancelled task's handler never run)", k, status, cancels)
		}
	}
	if !flakyFailed.Load() {
		t.Fatal("the flaky message never failed")
	}
	if groups.Load() == 0 || largest.Load() < 2 {
		t.Fatalf("%d groups, largest %d: a burst was not grouped", groups.Load(), largest.Load())
	}
	t.Logf("%d tasks in %d groups, largest %d", n, groups.Load(), largest.Load())
}

// A lock the group cannot get (here a lock wait that times out on the
// second of its rows, a message that names its task by key alone) fails
// the group as a whole: the rows read before the error must not make the
// rest look missing, which would ack them while their tasks stay open.
func TestHandleGroup_ALockErrorMidwayFailsTheGroupAndSkipsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, second := b.order(t, "first", time.Now().Add(-time.Millisecond)), b.order(t, "second", time.Now().Add(-time.Millisecond))
	secondID := second.TaskID
	byKey := *second
	byKey.TaskID = 0
	second = &byKey
	impatient := b.impatient(t)
	holder, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback() //nolint:errcheck
	if _, err := holder.ExecContext(b.ctx, "SELECT id FROM delay_task WHERE id = ? FOR UPDATE", secondID); err != nil {
		t.Fatal(err)
	}
	var ran []string
	out, errs, err := outbox.HandleGroup(b.ctx, impatient, []*broker.Message{first, second}, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		ran = append(ran, m.Key)
		return cancelOne(ctx, tx, m)
	})
	if err == nil {
		t.Fatalf("HandleGroup = %v, %v, nil; want the lock error (the row it could not lock is not missing)", out, errs)
	}
	if len(ran) != 0 {
		t.Fatalf("fn ran for %v in a group that failed", ran)
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"first", "second"} {
		if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", id); info.State != outbox.StatePending {
			t.Errorf("%s task is %s, want still pending", id, info.State)
		}
	}
}

// A task row another transaction holds (a business transaction cancelling
// the order's timeout, say) is left out of the group rather than waited
// for: the others commit at once, the held one comes back with
// broker.ErrHandleAlone, untouched, for Handle to run once the row is free.
// Waited for, it would hold up every message of the group for up to the
// server's lock wait timeout (here one second, and the group would fail).
func TestHandleGroup_ARowHeldElsewhereIsLeftOutNotWaitedFor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, held, last := b.order(t, "first", time.Now().Add(-time.Millisecond)), b.order(t, "held", time.Now().Add(-time.Millisecond)), b.order(t, "last", time.Now().Add(-time.Millisecond))
	impatient := b.impatient(t)
	holder, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback() //nolint:errcheck
	if _, err := holder.ExecContext(b.ctx, "SELECT id FROM delay_task WHERE id = ? FOR UPDATE", held.TaskID); err != nil {
		t.Fatal(err)
	}
	var ran []string
	fn := func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		ran = append(ran, m.Key)
		return cancelOne(ctx, tx, m)
	}
	out, errs, err := outbox.HandleGroup(b.ctx, impatient, []*broker.Message{first, held, last}, fn)
	if err != nil {
		t.Fatalf("HandleGroup: %v; want the held row left out, not waited for", err)
	}
	if out[0] != outbox.Handled || errs[0] != nil || out[2] != outbox.Handled || errs[2] != nil {
		t.Fatalf("first %v, %v; last %v, %v: want both handled", out[0], errs[0], out[2], errs[2])
	}
	if !errors.Is(errs[1], broker.ErrHandleAlone) {
		t.Fatalf("held: %v, %v; want broker.ErrHandleAlone", out[1], errs[1])
	}
	if strings.Join(ran, ",") != "first,last" {
		t.Fatalf("fn ran for %v, want first and last only", ran)
	}
	if status, _ := b.orderRow(t, "held"); status != "UNPAID" {
		t.Fatalf("held order %s: its handler ran", status)
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", "held"); info.State == outbox.StateDone {
		t.Fatal("the held task is done without its handler")
	}
	if o, err := outbox.Handle(b.ctx, b.db, held, cancelOrder("held")); err != nil || o != outbox.Handled {
		t.Fatalf("Handle(held) once free = %v, %v", o, err)
	}
	for _, id := range []string{"first", "held", "last"} {
		if status, cancels := b.orderRow(t, id); status != "CANCELLED" || cancels != 1 {
			t.Errorf("%s: %s with %d cancels", id, status, cancels)
		}
	}
}

// impatient opens the bundle's database on connections that give up on a
// row lock after one second.
func (b *bundle) impatient(t *testing.T) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{"innodb_lock_wait_timeout": "1"}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// handleGroupEarly is handleEarly through HandleGroup: the message is
// reported early in its errs entry and the group itself does not fail.
func (b *bundle) handleGroupEarly(t *testing.T, db *sql.DB, msg *broker.Message) {
	t.Helper()
	before, err := outbox.Get(b.ctx, b.db, msg.Topic, msg.Key)
	if err != nil {
		t.Fatal(err)
	}
	for how, m := range byIDAndByKey(msg) {
		_, errs, err := outbox.HandleGroup(b.ctx, db, []*broker.Message{m}, func(context.Context, *sql.Tx, *broker.Message) error {
			t.Errorf("%s: fn ran for a task the database's clock says is not due", how)
			return nil
		})
		if err != nil {
			t.Fatalf("HandleGroup %s: %v", how, err)
		}
		wantEarly(t, "HandleGroup "+how+": errs[0]", errs[0])
		b.wantUntouched(t, msg, before)
	}
}

// HandleGroup keeps what Handle keeps in
// TestHandle_ATaskDueByTheHostClockWaitsForTheDatabaseClock (handle_test.go).
func TestHandleGroup_ATaskDueByTheHostClockWaitsForTheDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now().Add(-time.Second))
	b.handleGroupEarly(t, b.clockBehind(t), msg)
}

// HandleGroup keeps what Handle keeps in
// TestHandle_TheSessionTimeZoneDoesNotMakeATaskDue (handle_test.go).
func TestHandleGroup_TheSessionTimeZoneDoesNotMakeATaskDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now().Add(time.Hour))
	msg.DeliverAt = broker.MillisUTC(time.Now()) // the message claims it is due
	b.handleGroupEarly(t, b.eightHoursEast(t), msg)
}

// HandleGroup keeps what Handle keeps in
// TestHandle_AFailedDoneMarkCommitsNoEffect (handle_test.go).
func TestHandleGroup_AFailedDoneMarkCommitsNoEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msgs := []*broker.Message{b.order(t, "o1", time.Now().Add(-time.Millisecond)), b.order(t, "o2", time.Now().Add(-time.Millisecond))}
	b.refuseDone(t)
	if _, _, err := outbox.HandleGroup(b.ctx, b.db, msgs, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		return countCancel(ctx, tx, m.Key)
	}); err == nil {
		t.Error("HandleGroup reported no error though its tasks could not be marked done")
	}
	b.wantNoEffectNotDone(t, "o1", "o2")
}

// erSavepointMissing is MariaDB's error for a ROLLBACK TO SAVEPOINT whose
// savepoint does not exist (ER_SP_DOES_NOT_EXIST).
const erSavepointMissing = 1305

// In the group's second run, a message whose fn fails after the server lost
// the transaction under it leaves no savepoint to roll back to. The group
// must fail whole: carrying on would run the next messages outside any
// transaction, each write committing on its own, and mark tasks done whose
// effects were rolled back.
func TestHandleGroup_ASavepointTheServerLostFailsTheWholeGroup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := []string{"a", "poison", "b", "c"}
	var msgs []*broker.Message
	for _, k := range keys {
		msgs = append(msgs, b.order(t, k, time.Now().Add(-time.Millisecond)))
	}
	boom := errors.New("payment service down")
	ran := map[string]int{}
	_, _, err := outbox.HandleGroup(b.ctx, b.db, msgs, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		ran[m.Key]++
		if err := cancelOne(ctx, tx, m); err != nil {
			return err
		}
		switch m.Key {
		case "poison":
			// Fails the first run, so the group runs again with savepoints.
			return boom
		case "b":
			// b runs only in the second run (the first stopped at poison).
			// Its write done, the transaction is rolled back under the
			// group, as the server does to a deadlock's victim, and the
			// savepoint goes with it.
			if _, err := tx.ExecContext(ctx, "ROLLBACK"); err != nil {
				return err
			}
			return errors.New("b lost its transaction")
		}
		return nil
	})
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != erSavepointMissing {
		t.Errorf("HandleGroup = %v; want the group failed with its savepoint gone (error %d)", err, erSavepointMissing)
	}
	if ran["a"] != 2 || ran["poison"] != 1 || ran["b"] != 1 {
		t.Fatalf("fn ran %v; want a twice, poison once, b once: the rerun did not go as planned", ran)
	}
	for _, k := range keys {
		if status, cancels := b.orderRow(t, k); status != "UNPAID" || cancels != 0 {
			t.Errorf("%s: order %s with %d cancels after the group failed; want no effect kept", k, status, cancels)
		}
	}
	if n := b.count(t, "state = 'done'"); n != 0 {
		t.Errorf("%d tasks done after the group failed; want none", n)
	}
	if n := b.count(t, "state = 'pending'"); n != len(keys) {
		t.Errorf("%d of %d tasks still pending; want all, for each message to be handled alone", n, len(keys))
	}
}

// When the first run of a group fails on one message, the group runs again
// with a savepoint per message; a message that fails only in that rerun,
// after its write, is rolled back to its savepoint: its write vanishes
// (from both runs), its task stays open and its error is reported, while
// the others' effects commit.
func TestHandleGroup_AMessageThatFailsInTheSavepointRerunIsRolledBackAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, flaky, third, poison := b.order(t, "first", time.Now().Add(-time.Millisecond)), b.order(t, "flaky", time.Now().Add(-time.Millisecond)), b.order(t, "third", time.Now().Add(-time.Millisecond)), b.order(t, "poison", time.Now().Add(-time.Millisecond))
	errPoison, errFlaky := errors.New("poison: always fails"), errors.New("flaky: fails in the rerun")
	calls := map[string]int{}
	out, errs, err := outbox.HandleGroup(b.ctx, b.db, []*broker.Message{first, flaky, third, poison}, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		calls[m.Key]++
		if err := cancelOne(ctx, tx, m); err != nil {
			return err
		}
		switch {
		case m.Key == "poison":
			return errPoison // the first run's failure: the group reruns with savepoints
		case m.Key == "flaky" && calls[m.Key] == 2:
			return errFlaky // after its write, in the savepoint rerun
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(calls); got != "map[first:2 flaky:2 poison:1 third:2]" {
		t.Fatalf("fn calls %s; want poison once and the rest twice (first run, then the savepoint rerun)", got)
	}
	if !errors.Is(errs[3], errPoison) || !errors.Is(errs[1], errFlaky) || errs[0] != nil || errs[2] != nil {
		t.Fatalf("errs = %v; want the poison's and the flaky message's errors only", errs)
	}
	if out[0] != outbox.Handled || out[2] != outbox.Handled {
		t.Fatalf("outcomes = %v; want the healthy messages handled", out)
	}
	for _, id := range []string{"flaky", "poison"} {
		if status, cancels := b.orderRow(t, id); status != "UNPAID" || cancels != 0 {
			t.Errorf("%s: order %s with %d cancels; its write must be rolled back", id, status, cancels)
		}
		if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", id); info.State != outbox.StatePending {
			t.Errorf("%s task is %s, want still pending", id, info.State)
		}
	}
	for _, id := range []string{"first", "third"} {
		if status, cancels := b.orderRow(t, id); status != "CANCELLED" || cancels != 1 {
			t.Errorf("%s: order %s with %d cancels, want cancelled once", id, status, cancels)
		}
		if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", id); info.State != outbox.StateDone {
			t.Errorf("%s task is %s, want done", id, info.State)
		}
	}
}

// A dead task in a group is skipped as dead and its handler does not run;
// it stays dead, for Replay, while the rest of the group is handled.
func TestHandleGroup_SkipsADeadTaskWithoutRunningIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, dead := b.order(t, "live", time.Now().Add(-time.Millisecond)), b.order(t, "dead", time.Now().Add(-time.Millisecond))
	if err := outbox.DeadLetter(b.db, nil).Dead(b.ctx, &broker.Delivery{Message: dead}, errors.New("failed 10 attempts")); err != nil {
		t.Fatal(err)
	}
	var ran []string
	out, errs, err := outbox.HandleGroup(b.ctx, b.db, []*broker.Message{live, dead}, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		ran = append(ran, m.Key)
		return cancelOne(ctx, tx, m)
	})
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("HandleGroup = %v, %v", errs, err)
	}
	if out[0] != outbox.Handled || out[1] != outbox.SkippedDead {
		t.Fatalf("outcomes = %v; want handled, skipped: dead", out)
	}
	if strings.Join(ran, ",") != "live" {
		t.Fatalf("fn ran for %v; want only the live task", ran)
	}
	if status, _ := b.orderRow(t, "dead"); status != "UNPAID" {
		t.Fatalf("the dead task's order is %s", status)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", "dead"); info.State != outbox.StateDead {
		t.Fatalf("the dead task is %s after HandleGroup; want still dead", info.State)
	}
}

// HandleGroup keeps what Handle keeps in
// TestHandle_ATaskIDOfAnotherKeyOrTopicIsMissing (handle_test.go).
// The same in a group: the messages naming another task's id are missing,
// the row is left alone, and the rest of the group runs.
func TestHandleGroup_ATaskIDOfAnotherKeyOrTopicIsMissing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live := b.order(t, "live", time.Now().Add(-time.Millisecond))
	b.order(t, "mine", time.Now().Add(-time.Millisecond))
	theirs := b.order(t, "theirs", time.Now().Add(-time.Millisecond))
	var ran []string
	out, errs, err := outbox.HandleGroup(b.ctx, b.db, append([]*broker.Message{live}, mismatched(theirs, "mine")...),
		func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
			ran = append(ran, m.Topic+"/"+m.Key)
			return cancelOne(ctx, tx, m)
		})
	if err != nil {
		t.Fatal(err)
	}
	want := []outbox.HandleResult{outbox.Handled, outbox.SkippedMissing, outbox.SkippedMissing}
	for i := range want {
		if out[i] != want[i] || errs[i] != nil {
			t.Errorf("message %d: %v, %v; want %v", i, out[i], errs[i], want[i])
		}
	}
	if strings.Join(ran, ",") != "order-cancel/live" {
		t.Fatalf("fn ran for %v; want only the live task", ran)
	}
	for _, id := range []string{"mine", "theirs"} {
		if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", id); info.State != outbox.StatePending {
			t.Errorf("%s task is %s, want untouched", id, info.State)
		}
		if status, _ := b.orderRow(t, id); status != "UNPAID" {
			t.Errorf("%s order is %s, want untouched", id, status)
		}
	}
}

// HandleGroup keeps what Handle keeps in
// TestHandle_ConcurrentDuplicatesByKeyHaveOneEffect (handle_test.go).
// The same for groups: concurrent groups that each carry the by-key
// message (beside a task of their own) run it once between them.
func TestHandleGroup_ConcurrentDuplicatesByKeyHaveOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	shared := b.order(t, "shared", time.Now().Add(-time.Millisecond))
	shared.TaskID = 0
	const n = 8
	own := make([]*broker.Message, n)
	for i := range own {
		own[i] = b.order(t, fmt.Sprintf("own-%d", i), time.Now())
	}
	var wg sync.WaitGroup
	outcomes := make([][]outbox.HandleResult, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, errs, err := outbox.HandleGroup(b.ctx, b.db, []*broker.Message{own[i], shared}, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
				return slowIncrement(ctx, tx, m.Key)
			})
			if err != nil || errs[0] != nil || errs[1] != nil {
				t.Errorf("group %d: %v, %v", i, errs, err)
				return
			}
			outcomes[i] = out
		}()
	}
	wg.Wait()
	handled := 0
	for i, out := range outcomes {
		if out == nil {
			continue
		}
		if out[0] != outbox.Handled {
			t.Errorf("group %d: own task %v, want handled", i, out[0])
		}
		switch out[1] {
		case outbox.Handled:
			handled++
		case outbox.SkippedDone:
		default:
			t.Errorf("group %d: shared task %v, want handled or skipped: done", i, out[1])
		}
	}
	if _, cancels := b.orderRow(t, "shared"); handled != 1 || cancels != 1 {
		t.Fatalf("shared task handled %d times, effect applied %d times; want 1 and 1", handled, cancels)
	}
	for i := range own {
		if _, cancels := b.orderRow(t, own[i].Key); cancels != 1 {
			t.Errorf("%s: effect applied %d times, want 1", own[i].Key, cancels)
		}
	}
}
