package outbox_test

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// Issue 43: a task 25 minutes past due that the scanner re-published a few
// times has its next rescue an hour ahead (the backoff) and its last
// publish a moment ago. Overdue counted from the latest of those and the
// due time, so status, /metrics and the NO CONSUMER line said 0 for it.
// Overdue means past due by the grace and not finished.
func TestStats_ATaskLongPastDueStaysOverdueWhateverItsRescueBackoff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	b.schedule(t, outbox.Task{Topic: "late", Key: "k1", DueAt: now.Add(-25 * time.Minute)})
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'published', published_ms = ?, next_attempt_ms = ?, rescues = 5",
		now.Add(-5*time.Second).UnixMilli(), now.Add(time.Hour).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	const grace = 30 * time.Second
	if err := outbox.RefreshStats(b.ctx, b.db, grace); err != nil {
		t.Fatal(err)
	}
	live, err := ops.CountStats(b.ctx, b.db, now, grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	read, err := ops.ReadStats(b.ctx, b.db, now, grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	if live.Overdue != 1 || read.Overdue != 1 {
		t.Fatalf("Overdue: CountStats %d, ReadStats %d; want 1: the task is 25 minutes late", live.Overdue, read.Overdue)
	}
	if live.OverduePending != 0 {
		t.Fatalf("OverduePending = %d, want 0: the task is published", live.OverduePending)
	}
	// The summary counts it too, so beyond the live scan it still shows.
	var summary int
	if err := b.db.QueryRow("SELECT overdue FROM delay_task_stats_run WHERE id = 1").Scan(&summary); err != nil || summary != 1 {
		t.Fatalf("summary overdue = %d, %v; want 1", summary, err)
	}
	got, err := ops.Unconsumed(b.ctx, b.db, now, grace, time.Minute)
	if err != nil || got["late"] != 1 {
		t.Fatalf("Unconsumed = %v, %v; want late: 1 (no consumer announced itself)", got, err)
	}
}

// The overdue counts read ranges of the (state, due_ms, id, topic) index,
// never the table: their cost stays bounded on a large outbox.
func TestStats_OverdueQueriesUseTheStateDueIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cut := time.Now().UnixMilli()
	for _, q := range []string{
		"EXPLAIN SELECT 1 FROM delay_task WHERE state = 'pending' AND due_ms < ? LIMIT 10001",
		"EXPLAIN SELECT 1 FROM delay_task WHERE state = 'published' AND due_ms < ? LIMIT 10001",
		"EXPLAIN SELECT COUNT(*) FROM delay_task WHERE state IN ('pending', 'published') AND due_ms < ?",
	} {
		rows, err := b.db.Query(q, cut)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			plan := map[string]string{}
			for i, c := range cols {
				if v, ok := vals[i].([]byte); ok {
					plan[c] = string(v)
				}
			}
			if plan["key"] != "ix_delay_task_state_due" || plan["type"] != "range" {
				t.Errorf("%s: plan %v; want a range of ix_delay_task_state_due", q, plan)
			}
		}
		rows.Close()
	}
}
