package store_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// migrated returns a scratch database with delaybridge's tables.
func migrated(t *testing.T) *sql.DB {
	t.Helper()
	db, _ := testenv.ScratchDB(t)
	if _, err := outbox.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db
}
