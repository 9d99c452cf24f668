package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/outbox"
)

// ledger is the part of a task row the consumer's guards protect.
type ledger struct {
	state       string
	gen         int64
	attempts    int
	nextAttempt int64
	lastError   string
}

func (b *bundle) ledger(t *testing.T, id int64) ledger {
	t.Helper()
	var (
		l       ledger
		lastErr sql.NullString
	)
	if err := b.db.QueryRowContext(b.ctx, "SELECT state, generation, attempts, next_attempt_ms, last_error FROM delay_task WHERE id = ?", id).
		Scan(&l.state, &l.gen, &l.attempts, &l.nextAttempt, &lastErr); err != nil {
		t.Fatal(err)
	}
	l.lastError = lastErr.String
	return l
}

// When the first run of a group fails on one message, the group runs again
// with a savepoint per message; a message that fails only in that rerun,
// after its write, is rolled back to its savepoint: its write vanishes
// (from both runs), its task stays open and its error is reported, while
// the others' effects commit.
func TestHandleGroup_AMessageThatFailsInTheSavepointRerunIsRolledBackAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, flaky, third, poison := b.order(t, "first", time.Now()), b.order(t, "flaky", time.Now()), b.order(t, "third", time.Now()), b.order(t, "poison", time.Now())
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
	live, dead := b.order(t, "live", time.Now()), b.order(t, "dead", time.Now())
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

// mismatched returns messages that carry the id of task but are not its
// messages: another key, and another topic.
func mismatched(task *broker.Message, otherKey string) []*broker.Message {
	wrongKey, wrongTopic := *task, *task
	wrongKey.Key = otherKey
	wrongTopic.Topic = "invoice-expire"
	return []*broker.Message{&wrongKey, &wrongTopic}
}

// A message whose TaskID names a row of another key or topic (an id the
// cleaner freed and a new task took) is not that row's message: Handle
// reports it missing and neither runs fn nor touches the row.
func TestHandle_ATaskIDOfAnotherKeyOrTopicIsMissing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "mine", time.Now())
	theirs := b.order(t, "theirs", time.Now())
	for _, m := range mismatched(theirs, "mine") {
		o, err := outbox.Handle(b.ctx, b.db, m, func(ctx context.Context, tx *sql.Tx) error {
			t.Errorf("%s/%s: fn ran for task %d", m.Topic, m.Key, m.TaskID)
			return cancelOrder(m.Key)(ctx, tx)
		})
		if err != nil || o != outbox.SkippedMissing {
			t.Errorf("%s/%s with task %d: Handle = %v, %v; want skipped: missing", m.Topic, m.Key, m.TaskID, o, err)
		}
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

// The same in a group: the messages naming another task's id are missing,
// the row is left alone, and the rest of the group runs.
func TestHandleGroup_ATaskIDOfAnotherKeyOrTopicIsMissing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live := b.order(t, "live", time.Now())
	b.order(t, "mine", time.Now())
	theirs := b.order(t, "theirs", time.Now())
	var ran []string
	out, errs, err := outbox.HandleGroup(b.ctx, b.db, append([]*broker.Message{live}, mismatched(theirs, "mine")...),
		func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
			ran = append(ran, m.Topic+"/"+m.Key)
			return cancelOne(ctx, tx, m)
		})
	if err != nil {
		t.Fatal(err)
	}
	want := []outbox.Outcome{outbox.Handled, outbox.SkippedMissing, outbox.SkippedMissing}
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

// slowIncrement counts every run in the order's cancels, unconditionally,
// after a pause that lets concurrent handlers of the same task overlap:
// only the task row's lock keeps the count to one.
func slowIncrement(ctx context.Context, tx *sql.Tx, key string) error {
	time.Sleep(50 * time.Millisecond)
	_, err := tx.ExecContext(ctx, "UPDATE orders SET cancels = cancels + 1 WHERE id = ?", key)
	return err
}

// Duplicates of a message without a task id (found by topic and key) run
// once when delivered concurrently: the row lock by key serializes them.
func TestHandle_ConcurrentDuplicatesByKeyHaveOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "by-key", time.Now())
	msg.TaskID = 0
	b.handleConcurrently(t, msg, 8, func(ctx context.Context, tx *sql.Tx) error { return slowIncrement(ctx, tx, "by-key") })
}

// The same for groups: concurrent groups that each carry the by-key
// message (beside a task of their own) run it once between them.
func TestHandleGroup_ConcurrentDuplicatesByKeyHaveOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	shared := b.order(t, "shared", time.Now())
	shared.TaskID = 0
	const n = 8
	own := make([]*broker.Message, n)
	for i := range own {
		own[i] = b.order(t, fmt.Sprintf("own-%d", i), time.Now())
	}
	var wg sync.WaitGroup
	outcomes := make([][]outbox.Outcome, n)
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

// Dead letters and retry records of an older generation's message, or of
// a message naming the row's id under another key or topic, leave the row
// as it is: a rescheduled task stays pending in its new generation with its
// attempt count.
func TestDeadLetterAndRecordRetry_LeaveANewerGenerationAndOtherTasksAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := b.order(t, "rescheduled", time.Now())
	if err := outbox.Reschedule(b.ctx, b.db, "order-cancel", "rescheduled", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	current := *old
	current.Generation = 1
	current.Attempt = 2
	current.DeliverAt = broker.MillisUTC(time.Now().Add(time.Minute))
	retry := outbox.RecordRetry(b.db)
	if err := retry(b.ctx, &current, errors.New("payment service down")); err != nil {
		t.Fatal(err)
	}
	before := b.ledger(t, old.TaskID)
	// A message of the current generation is in the broker, so its
	// retry makes the row published (see RecordRetry). The row counts
	// the failed run itself, whatever attempt the message claims.
	if before.state != "published" || before.gen != 1 || before.attempts != 1 || before.nextAttempt != current.DeliverAt.UnixMilli() {
		t.Fatalf("after the current generation's retry: %+v; want published, gen 1, one failed run recorded", before)
	}

	stale := *old
	stale.Attempt = 7
	stale.DeliverAt = broker.MillisUTC(time.Now().Add(2 * time.Hour))
	others := append([]*broker.Message{&stale}, mismatched(&current, "someone-else")...)
	dl := outbox.DeadLetter(b.db, nil)
	for _, m := range others {
		m.Attempt = 7
		if err := retry(b.ctx, m, errors.New("late retry")); err != nil {
			t.Fatal(err)
		}
		if got := b.ledger(t, old.TaskID); got != before {
			t.Fatalf("retry of %s/%s gen %d changed the row: %+v, want %+v", m.Topic, m.Key, m.Generation, got, before)
		}
		if err := dl.Dead(b.ctx, &broker.Delivery{Message: m}, errors.New("failed 10 attempts")); err != nil {
			t.Fatal(err)
		}
		if got := b.ledger(t, old.TaskID); got != before {
			t.Fatalf("dead letter of %s/%s gen %d changed the row: %+v, want %+v", m.Topic, m.Key, m.Generation, got, before)
		}
	}
}

// A dead letter or a retry record for a task that is already finished
// (done or cancelled) does not change it: a done task never turns dead.
func TestDeadLetterAndRecordRetry_LeaveFinishedTasksAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := b.order(t, "done", time.Now())
	if o, err := outbox.Handle(b.ctx, b.db, done, cancelOrder("done")); err != nil || o != outbox.Handled {
		t.Fatalf("Handle = %v, %v", o, err)
	}
	cancelled := b.order(t, "cancelled", time.Now())
	if err := outbox.Cancel(b.ctx, b.db, "order-cancel", "cancelled"); err != nil {
		t.Fatal(err)
	}
	dl, retry := outbox.DeadLetter(b.db, nil), outbox.RecordRetry(b.db)
	for _, m := range []*broker.Message{done, cancelled} {
		before := b.ledger(t, m.TaskID)
		late := *m
		late.Attempt = 3
		late.DeliverAt = broker.MillisUTC(time.Now().Add(time.Minute))
		if err := retry(b.ctx, &late, errors.New("late retry")); err != nil {
			t.Fatal(err)
		}
		if err := dl.Dead(b.ctx, &broker.Delivery{Message: &late}, errors.New("failed 10 attempts")); err != nil {
			t.Fatal(err)
		}
		// The keys name the states the tasks are in: "done", "cancelled".
		if got := b.ledger(t, m.TaskID); got != before || got.state != m.Key {
			t.Errorf("%s task: %+v after a late retry and dead letter, want %+v", m.Key, got, before)
		}
	}
}
