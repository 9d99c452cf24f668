package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/store"
	"github.com/delaybridge/delaybridge/outbox"
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
