package outbox

import (
	"context"
	"database/sql"

	"github.com/delaybridge/delaybridge/internal/outbox"
)

// Migration is one versioned schema change: its number, its name and the SQL
// it runs.
type Migration = outbox.Migration

// Migrations returns the table's migrations in version order.
func Migrations() ([]Migration, error) { return outbox.Migrations() }

// Migrate applies every migration the database has not seen yet and returns
// the versions it applied. It is idempotent and safe to run from several
// processes at once.
func Migrate(ctx context.Context, db *sql.DB) ([]int, error) { return outbox.Migrate(ctx, db) }

// CheckSchema returns an error matching delaybridge.ErrSchemaBehind, naming
// the missing migrations, when db lacks any of Migrations. Newer migrations
// than this build's are allowed.
func CheckSchema(ctx context.Context, db *sql.DB) error { return outbox.CheckSchema(ctx, db) }
