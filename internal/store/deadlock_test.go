package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/store"
)

// TestMarkHandOffFailed_RunsAgainWhenChosenAsADeadlockVictim makes the
// relay's record of a failed publish the victim of a real deadlock: it has
// locked the first of its two rows and waits for the second, which another
// transaction (the heavier one, so the server keeps it) holds and then
// asks for the first. The record must run again and put both rows back to
// pending; left unrecorded, they would stay published with no message
// behind them until the scanner's rescue, far past their due time.
func TestMarkHandOffFailed_RunsAgainWhenChosenAsADeadlockVictim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migrated(t)
	for _, k := range []string{"a", "b"} {
		if _, err := outbox.Schedule(ctx, db, outbox.Task{Topic: "dl", Key: k, DueAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	batch, err := store.ClaimLeased(ctx, db, store.ClaimSpec{State: store.Pending, DueAtMost: now.Add(time.Minute).UnixMilli(),
		ReadyAtMost: now.UnixMilli(), PublishedAtMost: 1<<63 - 1, Limit: 10, Owner: 7, LeaseUntil: now.Add(time.Hour).UnixMilli(),
		HandOffAt: now.UnixMilli()})
	if err != nil || len(batch) != 2 {
		t.Fatalf("claim: %d rows, %v; want 2", len(batch), err)
	}
	first, second := batch[0].Message.TaskID, batch[1].Message.TaskID
	if first > second {
		first, second = second, first
	}

	// The other transaction: heavy (a thousand rows written), holding the
	// second row.
	if _, err := db.ExecContext(ctx, "CREATE TABLE ballast (n INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	other, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := other.ExecContext(ctx, "INSERT INTO ballast SELECT seq FROM seq_1_to_1000"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ExecContext(ctx, "SELECT id FROM delay_task WHERE id = ? FOR UPDATE", second); err != nil {
		t.Fatal(err)
	}

	marked := make(chan error, 1)
	var n int64
	go func() {
		var err error
		n, err = store.MarkHandOffFailed(ctx, db, 7, batch, time.Now().UnixMilli(), time.Second, time.Minute, "publish failed: reset")
		marked <- err
	}()
	// The record locks the first row, then waits for the second: wait until
	// a third connection finds the first row locked.
	locked := func() bool {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback() //nolint:errcheck // read only
		rows, err := tx.QueryContext(ctx, "SELECT id FROM delay_task WHERE id = ? FOR UPDATE SKIP LOCKED", first)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		return !rows.Next()
	}
	waiting := false
	for deadline := time.Now().Add(10 * time.Second); !waiting && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		waiting = locked()
	}
	if !waiting {
		t.Fatal("the record never locked the first row; the test proves nothing")
	}
	// Now the other transaction asks for the first row: a deadlock, and the
	// server rolls back the lighter side, the record.
	if _, err := other.ExecContext(ctx, "UPDATE delay_task SET updated_ms = updated_ms + 1 WHERE id = ?", first); err != nil {
		t.Fatalf("the heavier transaction was the deadlock's victim (%v); the test proves nothing", err)
	}
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-marked:
		if err != nil || n != 2 {
			t.Fatalf("MarkHandOffFailed = %d, %v; want 2 rows recorded after the deadlock", n, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("MarkHandOffFailed did not return")
	}
	var pending int
	if err := db.QueryRowContext(ctx, fmt.Sprintf("SELECT COUNT(*) FROM delay_task WHERE state = 'pending' AND lease_owner = 0 AND id IN (%d, %d)", first, second)).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if pending != 2 {
		t.Fatalf("%d rows back to pending and released; want 2", pending)
	}
}
