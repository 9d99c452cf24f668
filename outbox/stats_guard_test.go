package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/outbox"
)

// insertOverdueCases writes, beside lost (a count of) published tasks lost
// an hour ago, one task of each kind that is not overdue with a grace of
// 30 s: published a moment ago, retried by a scanner just now, published
// ahead of a due time still to come, and pending, done, dead or cancelled
// an hour past due.
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

// Overdue counts published tasks past due whose last publish and last
// recorded retry are both older than the grace: lost publishes, the ones a
// scanner must rescue. It counts no task published ahead of its due time,
// just published or just retried, nor any task in another state.
func TestStats_OverdueCountsOnlyPublishedTasksLostPastTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertOverdueCases(t, 1)
	const grace = 30 * time.Second
	live, err := outbox.CountStats(b.ctx, b.db, time.Now(), grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	read, err := outbox.ReadStats(b.ctx, b.db, time.Now(), grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	if live.Overdue != 1 || read.Overdue != 1 {
		t.Fatalf("Overdue: CountStats %d, ReadStats %d; want 1, the one lost publish", live.Overdue, read.Overdue)
	}
}

// Past the 10,000 published tasks ReadStats looks at, the overdue count is
// the summary's, and the summary counts by the same rule.
func TestRefreshStats_OverdueBeyondTheLiveScanCountsOnlyLostPublishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lost = 10001
	b.insertOverdueCases(t, lost)
	const grace = 30 * time.Second
	if err := outbox.RefreshStats(b.ctx, b.db, grace); err != nil {
		t.Fatal(err)
	}
	st, err := outbox.ReadStats(b.ctx, b.db, time.Now(), grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Overdue != lost {
		t.Fatalf("Overdue = %d, want the %d lost publishes the summary counted", st.Overdue, lost)
	}
	live, err := outbox.CountStats(b.ctx, b.db, time.Now(), grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	if live.Overdue != lost {
		t.Fatalf("CountStats: Overdue = %d, want %d", live.Overdue, lost)
	}
}

// More than 10,000 published tasks past due of which none is lost (each
// published again a moment ago, as after a relay outage drains): the
// overdue count stays 0, as the summary and CountStats say, rather than
// jumping to the size of the live scan.
func TestReadStats_ManyRecentlyPublishedPastDueAreNotOverdue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	testenv.FillTasks(t, b.db, testenv.TaskRows{Topic: "drained", State: "published", N: 10001, KeyPrefix: "d-", DueMS: now.Add(-time.Hour).UnixMilli()})
	if _, err := b.db.Exec("UPDATE delay_task SET published_ms = ?", now.Add(-5*time.Second).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	const grace = 30 * time.Second
	if err := outbox.RefreshStats(b.ctx, b.db, grace); err != nil {
		t.Fatal(err)
	}
	read := func(name string, f func(context.Context, outbox.Querier, time.Time, time.Duration, time.Duration) (*outbox.Stats, error)) {
		t.Helper()
		st, err := f(b.ctx, b.db, time.Now(), grace, 0)
		if err != nil {
			t.Fatal(err)
		}
		if st.Overdue != 0 {
			t.Errorf("%s: Overdue = %d, want 0: every task was published again within the grace", name, st.Overdue)
		}
	}
	read("CountStats", outbox.CountStats)
	read("ReadStats with a summary", outbox.ReadStats)
	if _, err := b.db.Exec("DELETE FROM delay_task_stats_run"); err != nil {
		t.Fatal(err)
	}
	read("ReadStats without one", outbox.ReadStats)
}
