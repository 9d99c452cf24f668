package outbox_test

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

func TestOverdue_OnlyUnfinishedTasksPastTheirDueTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	b.schedule(t, outbox.Task{Topic: "c", Key: "pending-past", DueAt: past})
	b.schedule(t, outbox.Task{Topic: "c", Key: "pending-future", DueAt: future})
	b.schedule(t, outbox.Task{Topic: "c", Key: "published-past", DueAt: past})
	b.schedule(t, outbox.Task{Topic: "c", Key: "dead-past", DueAt: past})
	b.schedule(t, outbox.Task{Topic: "c", Key: "done-past", DueAt: past})
	b.schedule(t, outbox.Task{Topic: "c", Key: "cancelled-past", DueAt: past})
	for key, state := range map[string]string{"published-past": "published", "dead-past": "dead", "done-past": "done"} {
		if _, err := b.db.Exec("UPDATE delay_task SET state = ? WHERE topic = 'c' AND task_key = ?", state, key); err != nil {
			t.Fatal(err)
		}
	}
	if err := outbox.Cancel(b.ctx, b.db, "c", "cancelled-past"); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{
		"pending-past": true, "published-past": true, "dead-past": true,
		"pending-future": false, "done-past": false, "cancelled-past": false, "no-such-task": false,
	} {
		got, err := outbox.Overdue(b.ctx, b.db, "c", key)
		if err != nil || got != want {
			t.Errorf("Overdue(c, %s) = %v, %v; want %v", key, got, err, want)
		}
	}
	// The same key on another topic is another task.
	if got, err := outbox.Overdue(b.ctx, b.db, "other", "pending-past"); err != nil || got {
		t.Errorf("Overdue(other, pending-past) = %v, %v; want false", got, err)
	}
}

func TestDueMillis_IsWhatTheTableGivesBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	due := time.Date(2030, 1, 2, 3, 4, 5, 678_901_234, time.FixedZone("x", 3600))
	b.schedule(t, outbox.Task{Topic: "c", Key: "ms", DueAt: due})
	info, err := outbox.Get(b.ctx, b.db, "c", "ms")
	if err != nil {
		t.Fatal(err)
	}
	// Read back rounded up to the millisecond: never before the time asked.
	if want := time.UnixMilli(broker.DueMillis(due)).UTC(); !info.Task.DueAt.Equal(want) || info.Task.DueAt.Location() != time.UTC || info.Task.DueAt.Before(due) {
		t.Errorf("DueAt read back %v, want %v", info.Task.DueAt, want)
	}
	var ms int64
	if err := b.db.QueryRow("SELECT due_ms FROM delay_task WHERE topic = 'c' AND task_key = 'ms'").Scan(&ms); err != nil || ms != broker.DueMillis(due) {
		t.Errorf("due_ms %d (%v), want %d", ms, err, broker.DueMillis(due))
	}
}
