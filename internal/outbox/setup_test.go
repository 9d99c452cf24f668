package outbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// bundle is what an outbox test needs: a migrated scratch database of its own.
type bundle struct {
	db  *sql.DB
	dsn string
	ctx context.Context
}

// setup creates a scratch database, migrates it, and drops it at cleanup.
func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	db, dsn := testenv.ScratchDB(t)
	if _, err := outbox.Migrate(ctx, db); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (
  id VARCHAR(64) NOT NULL PRIMARY KEY,
  status VARCHAR(16) NOT NULL,
  cancels INT NOT NULL DEFAULT 0
) ENGINE = InnoDB`); err != nil {
		t.Fatal(err)
	}
	return &bundle{db: db, dsn: dsn, ctx: ctx}
}

func (b *bundle) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.QueryRowContext(b.ctx, "SELECT COUNT(*) FROM delay_task WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// schedule commits one task in its own transaction.
func (b *bundle) schedule(t *testing.T, task outbox.Task) int64 {
	t.Helper()
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := outbox.Schedule(b.ctx, tx, task)
	if err != nil {
		_ = tx.Rollback()
		t.Fatalf("Schedule(%s/%s): %v", task.Topic, task.Key, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return id
}
