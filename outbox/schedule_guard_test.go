package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/outbox"
)

// Cancel reaches a task wherever it is before it finished: waiting
// (pending), in the broker (published) and given up on (dead). A done task
// stays done.
func TestCancel_PendingPublishedAndDeadTasksAreCancelledADoneOneIsNot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, st := range []string{"pending", "published", "dead", "done"} {
		b.schedule(t, outbox.Task{Topic: "cx", Key: st, DueAt: time.Now().Add(-time.Minute)})
		if _, err := b.db.Exec("UPDATE delay_task SET state = ? WHERE topic = 'cx' AND task_key = ?", st, st); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []string{"pending", "published", "dead"} {
		if err := outbox.Cancel(b.ctx, b.db, "cx", st); err != nil {
			t.Errorf("Cancel(%s task) = %v, want nil", st, err)
		}
		if info, err := outbox.Get(b.ctx, b.db, "cx", st); err != nil || info.State != outbox.StateCancelled {
			t.Errorf("%s task after Cancel: %+v, %v; want cancelled", st, info, err)
		}
	}
	if err := outbox.Cancel(b.ctx, b.db, "cx", "done"); !errors.Is(err, outbox.ErrFinished) {
		t.Errorf("Cancel(done task) = %v, want ErrFinished", err)
	}
	if info, err := outbox.Get(b.ctx, b.db, "cx", "done"); err != nil || info.State != outbox.StateDone {
		t.Errorf("done task after Cancel: %+v, %v; want done", info, err)
	}
}

// Reschedule moves a pending, published or dead task to a new due time as
// a fresh pending task of the next generation: nothing of its last publish
// is kept. A done or cancelled task is never brought back: its effect ran
// (or must never run).
func TestReschedule_MovesUnfinishedTasksAndNeverRevivesAFinishedOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	for _, st := range []string{"pending", "published", "dead", "done", "cancelled"} {
		b.schedule(t, outbox.Task{Topic: "rs", Key: st, DueAt: old})
		if _, err := b.db.Exec(`UPDATE delay_task SET state = ?, published_ms = ?, last_error = 'publish failed: reset', publish_attempts = 2
WHERE topic = 'rs' AND task_key = ?`, st, old.UnixMilli(), st); err != nil {
			t.Fatal(err)
		}
	}
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	for _, st := range []string{"pending", "published", "dead"} {
		if err := outbox.Reschedule(b.ctx, b.db, "rs", st, due); err != nil {
			t.Errorf("Reschedule(%s task) = %v, want nil", st, err)
			continue
		}
		info, err := outbox.Get(b.ctx, b.db, "rs", st)
		if err != nil {
			t.Fatal(err)
		}
		if info.State != outbox.StatePending || info.Generation != 1 || !info.Task.DueAt.Equal(due) ||
			!info.PublishedAt.IsZero() || info.LastError != "" || info.PublishAttempts != 0 {
			t.Errorf("%s task after Reschedule: %+v; want pending, generation 1, the new due time, no publish or error kept", st, info)
		}
	}
	for _, st := range []string{"done", "cancelled"} {
		if err := outbox.Reschedule(b.ctx, b.db, "rs", st, due); !errors.Is(err, outbox.ErrFinished) {
			t.Errorf("Reschedule(%s task) = %v, want ErrFinished", st, err)
		}
		info, err := outbox.Get(b.ctx, b.db, "rs", st)
		if err != nil {
			t.Fatal(err)
		}
		if string(info.State) != st || info.Generation != 0 || !info.Task.DueAt.Equal(old) {
			t.Errorf("%s task after a refused Reschedule: %+v; want it unchanged", st, info)
		}
	}
}

// A configured MaxDelay bounds Schedule and Reschedule, not only the
// default ten years.
func TestOutbox_ConfiguredMaxDelayBoundsScheduleAndReschedule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := outbox.New(outbox.Config{MaxDelay: time.Hour})
	if _, err := o.Schedule(b.ctx, b.db, outbox.Task{Topic: "md", Key: "far", DueAt: time.Now().Add(2 * time.Hour)}); !errors.Is(err, broker.ErrTooFar) {
		t.Fatalf("Schedule 2h out under MaxDelay 1h = %v, want ErrTooFar", err)
	}
	if _, err := o.Schedule(b.ctx, b.db, outbox.Task{Topic: "md", Key: "near", DueAt: time.Now().Add(30 * time.Minute)}); err != nil {
		t.Fatalf("Schedule 30m out under MaxDelay 1h = %v", err)
	}
	if err := o.Reschedule(b.ctx, b.db, "md", "near", time.Now().Add(2*time.Hour)); !errors.Is(err, broker.ErrTooFar) {
		t.Fatalf("Reschedule 2h out under MaxDelay 1h = %v, want ErrTooFar", err)
	}
	if n := b.count(t, "topic = 'md' AND generation = 0"); n != 1 {
		t.Fatalf("%d tasks of generation 0, want only the one scheduled near", n)
	}
}
