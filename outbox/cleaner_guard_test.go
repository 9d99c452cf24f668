package outbox_test

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/outbox"
)

// The retention is counted from the due time to the cleaner's clock, to the
// millisecond: a finished task due before now minus the retention goes, one
// due at that instant or later stays, and no unfinished task goes however
// old it is.
func TestCleaner_RetentionCutsAtTheMillisecond(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now().Truncate(time.Millisecond)
	const retention = 24 * time.Hour
	cutoff := now.Add(-retention)
	for _, st := range []string{"done", "cancelled"} {
		for key, due := range map[string]time.Time{
			"before": cutoff.Add(-time.Millisecond), "at": cutoff, "after": cutoff.Add(time.Millisecond),
			"an-hour-ago": now.Add(-time.Hour), "tomorrow": now.Add(retention),
		} {
			b.schedule(t, outbox.Task{Topic: st, Key: key, DueAt: due})
		}
	}
	for _, st := range []string{"pending", "published", "dead"} {
		b.schedule(t, outbox.Task{Topic: st, Key: "a-year-ago", DueAt: now.AddDate(-1, 0, 0)})
	}
	if _, err := b.db.Exec("UPDATE delay_task SET state = topic, updated_ms = due_ms"); err != nil {
		t.Fatal(err)
	}
	n, err := outbox.NewCleaner(b.db, outbox.CleanerConfig{Retention: retention, BatchSize: 1, Duty: 1, Logger: quiet(),
		Now: func() time.Time { return now }}).Once(b.ctx)
	if err != nil || n != 2 {
		t.Fatalf("Once = %d, %v; want the 2 finished tasks due a millisecond before the cutoff", n, err)
	}
	if got := b.count(t, "task_key = 'before'"); got != 0 {
		t.Fatalf("%d finished tasks due before the cutoff left", got)
	}
	if got := b.count(t, "state IN ('done', 'cancelled')"); got != 8 {
		t.Fatalf("%d finished tasks within their retention left, want 8", got)
	}
	if got := b.count(t, "state IN ('pending', 'published', 'dead')"); got != 3 {
		t.Fatalf("%d of the 3 unfinished tasks a year old left", got)
	}
}

// A retention left zero, or set negative, is the default week: never "keep
// nothing", and never a cutoff in the future.
func TestCleaner_ZeroOrNegativeRetentionKeepsTheDefaultWeek(t *testing.T) {
	t.Parallel()
	for _, retention := range []time.Duration{0, -time.Hour} {
		b := setup(t)
		now := time.Now()
		for key, due := range map[string]time.Time{
			"eight-days-ago": now.Add(-8 * 24 * time.Hour), "six-days-ago": now.Add(-6 * 24 * time.Hour),
			"a-minute-ago": now.Add(-time.Minute), "in-half-an-hour": now.Add(30 * time.Minute),
		} {
			b.schedule(t, outbox.Task{Topic: "week", Key: key, DueAt: due})
		}
		if _, err := b.db.Exec("UPDATE delay_task SET state = 'done', updated_ms = due_ms"); err != nil {
			t.Fatal(err)
		}
		n, err := outbox.NewCleaner(b.db, outbox.CleanerConfig{Retention: retention, Logger: quiet()}).Once(b.ctx)
		if err != nil || n != 1 {
			t.Fatalf("Retention %v: Once = %d, %v; want only the task due 8 days ago", retention, n, err)
		}
		if got := b.count(t, "task_key = 'eight-days-ago'"); got != 0 {
			t.Fatalf("Retention %v: the task past the default week is left", retention)
		}
	}
}

// A task that finished long after it was due (replayed from dead a week
// later, or handled after a long outage) is kept for the retention after
// it finished, like any other: a late duplicate still finds it done, and
// its key stays taken.
func TestCleaner_KeepsATaskFinishedLateForItsRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	b.schedule(t, outbox.Task{Topic: "late", Key: "replayed", DueAt: now.Add(-8 * 24 * time.Hour)})
	b.schedule(t, outbox.Task{Topic: "late", Key: "finished-long-ago", DueAt: now.Add(-8 * 24 * time.Hour)})
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'done', done_ms = ?, updated_ms = ? WHERE task_key = 'replayed'", now.UnixMilli(), now.UnixMilli()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'done', done_ms = due_ms, updated_ms = due_ms WHERE task_key = 'finished-long-ago'"); err != nil {
		t.Fatal(err)
	}
	n, err := outbox.NewCleaner(b.db, outbox.CleanerConfig{Logger: quiet()}).Once(b.ctx)
	if err != nil || n != 1 {
		t.Fatalf("Once = %d, %v; want only the task finished a week ago deleted", n, err)
	}
	if got := b.count(t, "task_key = 'replayed'"); got != 1 {
		t.Fatal("the task finished a moment ago, due 8 days ago, was deleted")
	}
}
