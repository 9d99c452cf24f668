package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// ErrSchemaBehind reports a database that lacks a migration this binary
// ships. CheckSchema returns it before work starts, and a read that finds
// a migration's table missing wraps it: a process built for a newer schema
// must not run on an older one (a missing table or index fails later,
// mid-work).
var ErrSchemaBehind = errors.New("outbox: the database schema is older than this binary")

// CheckSchema reports ErrSchemaBehind, naming the missing migrations, when
// db lacks any migration Migrations returns. Migrations newer than the
// binary's are allowed: an upgrade migrates first, then replaces the
// binaries one by one.
func CheckSchema(ctx context.Context, db *sql.DB) error {
	migs, err := Migrations()
	if err != nil {
		return err
	}
	if db == nil {
		return errors.New("outbox: CheckSchema needs a database, got nil")
	}
	rows, err := db.QueryContext(ctx, "SELECT version FROM delaybridge_migration")
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1146 { // no such table
		return fmt.Errorf("%w: no migrations recorded (run delaybridge migrate): %w", ErrSchemaBehind, err)
	}
	if err != nil {
		// A database that is down, refuses the login or a done ctx: not a
		// schema to migrate.
		return fmt.Errorf("outbox: read applied migrations: %w", err)
	}
	defer rows.Close()
	have := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return fmt.Errorf("outbox: read applied migrations: %w", err)
		}
		have[v] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outbox: read applied migrations: %w", err)
	}
	var missing []string
	for _, m := range migs {
		if !have[m.Version] {
			missing = append(missing, m.Name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: it lacks %s; run delaybridge migrate (or outbox.Migrate) first", ErrSchemaBehind, strings.Join(missing, ", "))
	}
	return nil
}
