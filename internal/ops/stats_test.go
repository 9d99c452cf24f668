package ops_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// The summary is what the last refresh counted, not what is there now, and
// says how old it is.
func TestReadStats_StaleSummaryReportsItsAge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, outbox.Task{Topic: "t", Key: "before", DueAt: time.Now().Add(time.Hour)})
	if err := outbox.RefreshStats(b.ctx, b.db, time.Second); err != nil {
		t.Fatal(err)
	}
	_, err := b.db.ExecContext(b.ctx, "UPDATE delay_task_stats_run SET computed_ms = computed_ms - 3600000")
	if err != nil {
		t.Fatal(err)
	}
	b.schedule(t, outbox.Task{Topic: "t", Key: "after", DueAt: time.Now().Add(time.Hour)})

	st, err := ops.ReadStats(b.ctx, b.db, time.Now(), time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Backlog[outbox.StatePending]["t"]; got != 1 {
		t.Fatalf("the summary counts what the refresh saw: got %v, want %v", got, 1)
	}
	if st.CountsAge < time.Hour || st.CountsAge >= time.Hour+time.Minute {
		t.Fatalf("CountsAge %v, want an hour and less than a minute", st.CountsAge)
	}
	if d := time.Since(st.CountsAt) - time.Hour; d < -time.Minute || d > time.Minute {
		t.Fatalf("CountsAt %v, want within a minute of an hour ago", st.CountsAt)
	}
}

// Before any refresh ReadStats has no counts to give, and says so with a
// zero CountsAt rather than zeros that read as an empty outbox.
func TestReadStats_WithoutSummaryHasNoCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	b.schedule(t, outbox.Task{Topic: "t", Key: "k", DueAt: due})
	st, err := ops.ReadStats(b.ctx, b.db, time.Now(), time.Second, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !st.CountsAt.IsZero() {
		t.Fatalf("CountsAt %v, want zero: no refresh ran", st.CountsAt)
	}
	if len(st.Backlog) != 0 {
		t.Fatalf("Backlog %v, want none", st.Backlog)
	}
	if !st.OldestPendingDue.Equal(due) {
		t.Fatalf("live figures are still read: %v", st.OldestPendingDue)
	}
}

func TestReadStats_OnADatabaseBeforeMigration4SaysToMigrate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Exec("DROP TABLE delay_task_stats_run")
	if err != nil {
		t.Fatal(err)
	}
	_, err = ops.ReadStats(b.ctx, b.db, time.Now(), time.Second, time.Minute)
	if !errors.Is(err, outbox.ErrSchemaBehind) || !strings.Contains(err.Error(), "delaybridge migrate") {
		t.Fatalf("err = %v, want ErrSchemaBehind naming delaybridge migrate", err)
	}
}

// insertOverdueCases writes, beside lost (a count of) published tasks lost
// an hour ago, three more tasks an hour past due that are overdue with a
// grace of 30 s (published a moment ago, retried by a scanner just now,
// pending) and one task of each kind that is not: published ahead of a
// due time still to come, pending due within the grace, and done, dead
// or cancelled an hour past due.
func (b *bundle) insertOverdueCases(t *testing.T, lost int) {
	t.Helper()
	now := time.Now()
	hourAgo := now.Add(-time.Hour).UnixMilli()
	if _, err := b.db.ExecContext(b.ctx, fmt.Sprintf(`INSERT INTO delay_task
  (topic, task_key, due_ms, payload, state, created_ms, updated_ms, published_ms, next_attempt_ms)
SELECT 'od', CONCAT('lost-', seq), ?, '', 'published', ?, ?, ?, 0 FROM seq_1_to_%d`, lost), hourAgo, hourAgo, hourAgo, hourAgo); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key, state                  string
		due, published, nextAttempt int64
	}{
		{"published-a-moment-ago", "published", hourAgo, now.Add(-5 * time.Second).UnixMilli(), 0},
		{"retried-just-now", "published", hourAgo, hourAgo, now.UnixMilli()},
		{"published-ahead", "published", now.Add(10 * time.Second).UnixMilli(), now.Add(-40 * time.Second).UnixMilli(), 0},
		{"pending", "pending", hourAgo, 0, 0},
		{"pending-within-grace", "pending", now.Add(-10 * time.Second).UnixMilli(), 0, 0},
		{"done", "done", hourAgo, hourAgo, 0},
		{"dead", "dead", hourAgo, hourAgo, 0},
		{"cancelled", "cancelled", hourAgo, hourAgo, 0},
	} {
		if _, err := b.db.ExecContext(b.ctx, `INSERT INTO delay_task
  (topic, task_key, due_ms, payload, state, created_ms, updated_ms, published_ms, next_attempt_ms)
VALUES ('od', ?, ?, '', ?, ?, ?, ?, ?)`, c.key, c.due, c.state, hourAgo, hourAgo, c.published, c.nextAttempt); err != nil {
			t.Fatal(err)
		}
	}
}

// overdueOthers is how many tasks insertOverdueCases writes beside the
// lost ones that are overdue, and how many of those are pending.
const overdueOthers, overduePending = 3, 1

// Overdue counts unfinished tasks (pending or published) more than the
// grace past due, whenever they were last published or retried: late is
// late. It counts no task due within the grace or still to come, nor any
// finished or dead task.
func TestStats_OverdueCountsUnfinishedTasksPastDueAndTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertOverdueCases(t, 1)
	const grace = 30 * time.Second
	live, err := ops.CountStats(b.ctx, b.db, time.Now(), grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	read, err := ops.ReadStats(b.ctx, b.db, time.Now(), grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	const want = 1 + overdueOthers
	if live.Overdue != want || read.Overdue != want || live.OverduePending != overduePending || read.OverduePending != overduePending {
		t.Fatalf("Overdue: CountStats %d (%d pending), ReadStats %d (%d pending); want %d (%d pending)",
			live.Overdue, live.OverduePending, read.Overdue, read.OverduePending, want, overduePending)
	}
}

// Past the 10,000 tasks ReadStats looks at, the overdue count is the
// summary's, and the summary counts by the same rule.
func TestRefreshStats_OverdueBeyondTheLiveScanCountsByTheSameRule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lost = 10001
	b.insertOverdueCases(t, lost)
	const grace = 30 * time.Second
	if err := outbox.RefreshStats(b.ctx, b.db, grace); err != nil {
		t.Fatal(err)
	}
	st, err := ops.ReadStats(b.ctx, b.db, time.Now(), grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Overdue != lost+overdueOthers {
		t.Fatalf("Overdue = %d, want the %d the summary counted", st.Overdue, lost+overdueOthers)
	}
	live, err := ops.CountStats(b.ctx, b.db, time.Now(), grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	if live.Overdue != lost+overdueOthers {
		t.Fatalf("CountStats: Overdue = %d, want %d", live.Overdue, lost+overdueOthers)
	}
}

// More than 10,000 published tasks past due, each published again a
// moment ago (as after a relay outage drains): every one is overdue. The
// summary and CountStats count them all; ReadStats without a summary says
// at least the 10,000 it read.
func TestReadStats_ManyRecentlyPublishedPastDueAreOverdue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	const n = 10001
	testenv.FillTasks(t, b.db, testenv.TaskRows{Topic: "drained", State: "published", N: n, KeyPrefix: "d-", DueMS: now.Add(-time.Hour).UnixMilli()})
	if _, err := b.db.Exec("UPDATE delay_task SET published_ms = ?", now.Add(-5*time.Second).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	const grace = 30 * time.Second
	if err := outbox.RefreshStats(b.ctx, b.db, grace); err != nil {
		t.Fatal(err)
	}
	read := func(name string, f func(context.Context, outbox.Querier, time.Time, time.Duration, time.Duration) (*ops.Stats, error), want int) {
		t.Helper()
		st, err := f(b.ctx, b.db, time.Now(), grace, 0)
		if err != nil {
			t.Fatal(err)
		}
		if st.Overdue != want {
			t.Errorf("%s: Overdue = %d, want %d", name, st.Overdue, want)
		}
	}
	read("CountStats", ops.CountStats, n)
	read("ReadStats with a summary", ops.ReadStats, n)
	if _, err := b.db.Exec("DELETE FROM delay_task_stats_run"); err != nil {
		t.Fatal(err)
	}
	read("ReadStats without one", ops.ReadStats, 10000)
}
