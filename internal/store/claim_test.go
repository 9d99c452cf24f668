package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/store"
)

// A claim given After takes the rows after it in (due_ms, id) order, ties
// of due_ms included, and reads the index from there: not the rows before
// it, which earlier claims still hold leased. The statement's index reads
// are counted on the claim's own connection (the pool has one).
func TestClaimLeased_AfterStartsPastTheRowsEarlierClaimsHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migrated(t)
	db.SetMaxOpenConns(1)
	// 600 rows on 3 due times, 200 each, so claims of 150 end inside one.
	base := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	tasks := make([]outbox.Task, 600)
	for i := range tasks {
		tasks[i] = outbox.Task{Topic: "after", Key: fmt.Sprintf("k-%03d", i), DueAt: base.Add(time.Duration(i/200) * time.Second)}
	}
	if err := outbox.ScheduleMany(ctx, db, tasks); err != nil {
		t.Fatal(err)
	}
	var order []store.Position // every row, as a claim from the head takes them
	rows, err := db.QueryContext(ctx, "SELECT due_ms, id FROM delay_task ORDER BY due_ms, id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p store.Position
		if err := rows.Scan(&p.DueMS, &p.ID); err != nil {
			t.Fatal(err)
		}
		order = append(order, p)
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}

	const limit = 150
	claim := func(after *store.Position) ([]store.Claimed, int) {
		t.Helper()
		before := indexReads(t, db)
		now := time.Now()
		batch, err := store.ClaimLeased(ctx, db, store.ClaimSpec{State: store.Pending, DueAtMost: now.UnixMilli(),
			ReadyAtMost: now.UnixMilli(), PublishedAtMost: 1<<63 - 1, Limit: limit, Owner: store.NewLeaseOwner(),
			LeaseUntil: now.Add(time.Hour).UnixMilli(), After: after})
		if err != nil {
			t.Fatal(err)
		}
		return batch, indexReads(t, db) - before
	}
	var after *store.Position
	for n := 0; n < len(order); n += limit {
		batch, reads := claim(after)
		if len(batch) != limit {
			t.Fatalf("claim %d: %d rows, want %d", n/limit, len(batch), limit)
		}
		for i, c := range batch {
			if got := store.PositionOf(c); got != order[n+i] {
				t.Fatalf("claim %d, row %d: %+v, want %+v (the next in due, id order)", n/limit, i, got, order[n+i])
			}
		}
		// Each row it takes twice, in the index and by id to lease it,
		// and the entry past them that ends the range.
		if reads > 2*limit+1 {
			t.Fatalf("claim %d after %+v read %d index entries for %d rows: it read again the %d rows earlier claims hold",
				n/limit, after, reads, limit, n)
		}
		last := store.PositionOf(batch[len(batch)-1])
		after = &last
	}
	// From the head, the same claim reads every leased row again to find none.
	if batch, reads := claim(nil); len(batch) != 0 || reads < len(order) {
		t.Fatalf("a claim from the head: %d rows after %d index reads; want 0 rows after reading the %d leased", len(batch), reads, len(order))
	}
}

// indexReads is how many index entries db's one connection has read.
func indexReads(t *testing.T, db *sql.DB) int {
	t.Helper()
	var total int
	rows, err := db.Query("SHOW SESSION STATUS WHERE Variable_name IN ('Handler_read_key', 'Handler_read_next')")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return total
}

// First finds the row a claim would take: none while the only row is
// leased, the row once its lease has expired; and it refuses a state no
// claim takes.
func TestFirst_FindsWhatAClaimWouldTake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migrated(t)
	if _, err := outbox.Schedule(ctx, db, outbox.Task{Topic: "look", Key: "k", DueAt: time.Now().Add(-time.Second)}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	spec := func(at time.Time) store.ClaimSpec {
		return store.ClaimSpec{State: store.Pending, DueAtMost: at.UnixMilli(), ReadyAtMost: at.UnixMilli(), PublishedAtMost: 1<<63 - 1,
			Limit: 10, Owner: 1, LeaseUntil: now.Add(time.Minute).UnixMilli()}
	}
	look := func(at time.Time) bool {
		t.Helper()
		p, err := store.First(ctx, db, spec(at))
		if err != nil {
			t.Fatal(err)
		}
		return p != nil
	}
	if !look(now) {
		t.Fatal("a due pending row: First found none")
	}
	if batch, err := store.ClaimLeased(ctx, db, spec(now)); err != nil || len(batch) != 1 {
		t.Fatalf("claim: %d rows, %v", len(batch), err)
	}
	if look(now) {
		t.Fatal("the only row leased for a minute: First found it")
	}
	if !look(now.Add(2 * time.Minute)) {
		t.Fatal("the lease expired: First found none")
	}
	if _, err := store.First(ctx, db, store.ClaimSpec{State: "done'; --"}); err == nil {
		t.Fatal("First took a state no claim takes")
	}
}

// claimAll schedules a task due a second ago for each key and claims them
// all for owner, oldest first.
func claimAll(t *testing.T, db *sql.DB, owner int64, keys ...string) []store.Claimed {
	t.Helper()
	return claimKeys(t, db, owner, 0, keys...)
}

// handOffAll is claimAll with a relay's claim, which marks the rows
// published at handOff.
func handOffAll(t *testing.T, db *sql.DB, owner, handOff int64, keys ...string) []store.Claimed {
	t.Helper()
	return claimKeys(t, db, owner, handOff, keys...)
}

func claimKeys(t *testing.T, db *sql.DB, owner, handOff int64, keys ...string) []store.Claimed {
	t.Helper()
	ctx := context.Background()
	for i, k := range keys {
		due := time.Now().Add(time.Duration(i-len(keys)-1) * time.Second)
		if _, err := outbox.Schedule(ctx, db, outbox.Task{Topic: "guard", Key: k, DueAt: due}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	batch, err := store.ClaimLeased(ctx, db, store.ClaimSpec{State: store.Pending, DueAtMost: now.UnixMilli(), ReadyAtMost: now.UnixMilli(),
		PublishedAtMost: 1<<63 - 1, Limit: 100, Owner: owner, LeaseUntil: now.Add(time.Minute).UnixMilli(), HandOffAt: handOff})
	if err != nil || len(batch) != len(keys) {
		t.Fatalf("claim: %d rows, %v; want %d", len(batch), err, len(keys))
	}
	return batch
}

func countWhere(t *testing.T, db *sql.DB, where string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM delay_task WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A row whose generation moved while the claim held it (changed by a
// hand-written UPDATE or an older binary that left the lease) is no longer
// the claim's: no outcome statement touches it, the confirm included.
func TestOutcome_ARowOfANewerGenerationIsLeftAloneThoughTheLeaseIsKept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migrated(t)
	batch := claimAll(t, db, 7, "moved")
	at := time.Now().UnixMilli()
	handed := handOffAll(t, db, 8, at, "handed")
	// As Reschedule leaves them, but for the lease.
	if _, err := db.Exec("UPDATE delay_task SET generation = generation + 1, due_ms = due_ms + 3600000, state = 'pending', published_ms = 0, publish_attempts = 0 WHERE task_key IN ('moved', 'handed')"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE delay_task SET state = 'published' WHERE task_key = 'handed'"); err != nil {
		t.Fatal(err)
	}
	for name, record := range map[string]func() (int64, error){
		"MarkHandOffFailed": func() (int64, error) {
			return store.MarkHandOffFailed(ctx, db, 8, handed, at, time.Second, time.Minute, "publish failed: reset")
		},
		"MarkHandOffDead": func() (int64, error) {
			return store.MarkHandOffDead(ctx, db, 8, handed, at, "publish rejected: too large")
		},
		"ReleaseHandOff": func() (int64, error) { return store.ReleaseHandOff(ctx, db, 8, handed) },
		"MarkFailed": func() (int64, error) {
			return store.MarkFailed(ctx, db, 7, store.Pending, batch, at, time.Second, time.Minute, 0, "publish failed: reset")
		},
		"MarkDead": func() (int64, error) {
			return store.MarkDead(ctx, db, 7, store.Pending, batch, at, "publish rejected: too large")
		},
		"Release": func() (int64, error) { return store.Release(ctx, db, 7, store.Pending, batch) },
	} {
		if n, err := record(); err != nil || n != 0 {
			t.Errorf("%s on a row of a newer generation changed %d rows (%v), want 0", name, n, err)
		}
	}
	if got := countWhere(t, db, "task_key = 'moved' AND state = 'pending' AND generation = 1 AND publish_attempts = 0 AND published_ms = 0 AND last_error IS NULL"); got != 1 {
		t.Fatal("the row of the newer generation was changed by the old claim's outcome")
	}
	if got := countWhere(t, db, "task_key = 'handed' AND state = 'published' AND generation = 1 AND publish_attempts = 0 AND last_error IS NULL"); got != 1 {
		t.Fatal("the row of the newer generation was changed by the old hand-off's outcome")
	}
}

// A transient failure backs a row off by initial × 2^attempts, never more
// than maxWait, less the skew, from the moment recorded.
func TestMarkFailed_BackoffDoublesPerAttemptUpToMaxWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migrated(t)
	cases := []struct {
		key         string
		attempts    int
		skew        time.Duration
		wantAfterAt int64 // ms
	}{
		{"first", 0, 0, 1000},
		{"fourth", 3, 0, 8000},
		{"capped", 5, 0, 30000},
		{"far-capped", 40, 0, 30000},
		{"skewed", 40, 10 * time.Second, 20000},
	}
	keys := make([]string, len(cases))
	for i, c := range cases {
		keys[i] = c.key
	}
	batch := claimAll(t, db, 9, keys...)
	byKey := map[string]store.Claimed{}
	for _, c := range batch {
		byKey[c.Message.Key] = c
	}
	at := time.Now().UnixMilli()
	for _, c := range cases {
		if _, err := db.Exec("UPDATE delay_task SET publish_attempts = ? WHERE task_key = ?", c.attempts, c.key); err != nil {
			t.Fatal(err)
		}
		if n, err := store.MarkFailed(ctx, db, 9, store.Pending, []store.Claimed{byKey[c.key]}, at, time.Second, 30*time.Second, c.skew, "publish failed: reset"); err != nil || n != 1 {
			t.Fatalf("%s: MarkFailed = %d, %v", c.key, n, err)
		}
		var next int64
		var attempts int
		if err := db.QueryRow("SELECT next_attempt_ms, publish_attempts FROM delay_task WHERE task_key = ?", c.key).Scan(&next, &attempts); err != nil {
			t.Fatal(err)
		}
		if next-at != c.wantAfterAt || attempts != c.attempts+1 {
			t.Errorf("%s (%d attempts, skew %v): next attempt %d ms after, %d attempts; want %d ms, %d",
				c.key, c.attempts, c.skew, next-at, attempts, c.wantAfterAt, c.attempts+1)
		}
	}
}

// A relay's claim records the hand-off in the lease's own write: the rows
// are published at the claim's time, their attempt counted, still leased
// to the claim until LeaseUntil, which keeps the scanner off them while
// the publish may still be running.
func TestClaim_AHandOffMarksTheRowsPublishedUnderTheLease(t *testing.T) {
	t.Parallel()
	db := migrated(t)
	at := time.Now().UnixMilli()
	batch := handOffAll(t, db, 5, at, "a", "b")
	for _, c := range batch {
		if c.Message.TaskID == 0 {
			t.Fatal("a claimed message has no task id")
		}
	}
	if got := countWhere(t, db, "state = 'published' AND published_ms = ? AND updated_ms = ? AND publish_attempts = 1 AND lease_owner = 5 AND next_attempt_ms > ?", at, at, at); got != 2 {
		t.Fatalf("%d of 2 rows published under the claim's lease", got)
	}
}

// A publish that did not go through undoes the hand-off: a failed one
// backs off from the attempts before it (the claim counted this one), a
// stopping relay gives the attempt back, a refused one goes dead; none of
// them leaves a publish time or a lease behind.
func TestHandOff_AnUnconfirmedPublishUndoesTheMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migrated(t)
	at := time.Now().UnixMilli()
	batch := handOffAll(t, db, 6, at, "failed", "released", "refused")
	byKey := map[string][]store.Claimed{}
	for _, c := range batch {
		byKey[c.Message.Key] = []store.Claimed{c}
	}
	if n, err := store.MarkHandOffFailed(ctx, db, 6, byKey["failed"], at, time.Second, time.Minute, "publish failed: reset"); err != nil || n != 1 {
		t.Fatalf("MarkHandOffFailed = %d, %v", n, err)
	}
	if n, err := store.ReleaseHandOff(ctx, db, 6, byKey["released"]); err != nil || n != 1 {
		t.Fatalf("ReleaseHandOff = %d, %v", n, err)
	}
	if n, err := store.MarkHandOffDead(ctx, db, 6, byKey["refused"], at, "publish rejected: no"); err != nil || n != 1 {
		t.Fatalf("MarkHandOffDead = %d, %v", n, err)
	}
	for where, what := range map[string]string{
		"task_key = 'failed' AND state = 'pending' AND publish_attempts = 1 AND next_attempt_ms = ? + 1000 AND last_error = 'publish failed: reset'": "the failed row, backed off 1 s",
		"task_key = 'released' AND state = 'pending' AND publish_attempts = 0 AND next_attempt_ms = 0 AND ? > 0":                                     "the released row, free at once",
		"task_key = 'refused' AND state = 'dead' AND publish_attempts = 1 AND next_attempt_ms = 0 AND ? > 0":                                         "the refused row, dead",
	} {
		if got := countWhere(t, db, where+" AND published_ms = 0 AND lease_owner = 0", at); got != 1 {
			t.Errorf("%s: not as recorded (%s)", what, where)
		}
	}
}

// A claim skips a row a business transaction holds locked (a payment that
// locked its task to cancel it) and takes the rest at once: it never waits
// for that transaction, nor makes it wait.
func TestClaimLeased_SkipsARowABusinessTransactionHoldsWithoutWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migrated(t)
	for i, k := range []string{"held", "free"} {
		if _, err := outbox.Schedule(ctx, db, outbox.Task{Topic: "skip", Key: k, DueAt: time.Now().Add(time.Duration(i-3) * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	payment, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer payment.Rollback() //nolint:errcheck // a no-op after Commit
	var id int64
	if err := payment.QueryRowContext(ctx, "SELECT id FROM delay_task WHERE topic = 'skip' AND task_key = 'held' FOR UPDATE").Scan(&id); err != nil {
		t.Fatal(err)
	}
	// The server's lock wait is far longer than this bound; a claim that
	// waits for the payment fails here instead.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	now := time.Now()
	batch, err := store.ClaimLeased(cctx, db, store.ClaimSpec{State: store.Pending, DueAtMost: now.UnixMilli(), ReadyAtMost: now.UnixMilli(),
		PublishedAtMost: 1<<63 - 1, Limit: 10, Owner: 3, LeaseUntil: now.Add(time.Minute).UnixMilli()})
	if err != nil {
		t.Fatalf("claim beside a held row: %v", err)
	}
	if len(batch) != 1 || batch[0].Message.Key != "free" {
		keys := make([]string, len(batch))
		for i, c := range batch {
			keys[i] = c.Message.Key
		}
		t.Fatalf("claimed %q, want only the row nobody holds", keys)
	}
	if _, err := payment.ExecContext(ctx, "UPDATE delay_task SET state = 'cancelled' WHERE id = ?", id); err != nil {
		t.Fatal(err)
	}
	if err := payment.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := countWhere(t, db, "task_key = 'held' AND state = 'cancelled' AND lease_owner = 0"); got != 1 {
		t.Fatal("the held row was leased by the claim")
	}
}

// A claim of published rows (the scanner's) takes only the rows whose last
// publish is at most PublishedAtMost: a message just sent is not lost.
func TestClaimLeased_PublishedRowsOnlyOnceTheirLastPublishIsOldEnough(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migrated(t)
	now := time.Now()
	for key, published := range map[string]time.Time{"long-ago": now.Add(-time.Hour), "just-now": now.Add(-time.Second)} {
		if _, err := outbox.Schedule(ctx, db, outbox.Task{Topic: "rescue", Key: key, DueAt: now.Add(-2 * time.Hour)}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec("UPDATE delay_task SET state = 'published', published_ms = ? WHERE task_key = ?", published.UnixMilli(), key); err != nil {
			t.Fatal(err)
		}
	}
	cutoff := now.Add(-30 * time.Second).UnixMilli()
	batch, err := store.ClaimLeased(ctx, db, store.ClaimSpec{State: store.Published, DueAtMost: cutoff, ReadyAtMost: cutoff,
		PublishedAtMost: cutoff, Limit: 10, Owner: 4, LeaseUntil: now.Add(time.Minute).UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, c := range batch {
		keys = append(keys, c.Message.Key)
	}
	if fmt.Sprint(keys) != "[long-ago]" {
		t.Fatalf("claimed %q, want only the row published an hour ago", keys)
	}
}
