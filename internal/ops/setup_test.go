package ops_test

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"testing"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// bundle holds an ops test's migrated scratch database, dropped at cleanup.
type bundle struct {
	ctx context.Context
	db  *sql.DB
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db, _ := testenv.ScratchDB(t)
	b := &bundle{ctx: context.Background(), db: db}
	if _, err := outbox.Migrate(b.ctx, db); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return b
}

// schedule writes one task, committed on its own.
func (b *bundle) schedule(t *testing.T, task outbox.Task) int64 {
	t.Helper()
	id, err := outbox.Schedule(b.ctx, b.db, task)
	if err != nil {
		t.Fatalf("Schedule(%s/%s): %v", task.Topic, task.Key, err)
	}
	return id
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
