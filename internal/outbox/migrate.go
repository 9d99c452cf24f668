package outbox

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one versioned schema change shipped in the binary.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("outbox: migration file %q is not named NNNN_name.sql", name)
		}
		body, err := fs.ReadFile(migrationFiles, "migrations/"+name)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(name, ".sql"), SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// migrateLock serialises migrators across processes.
const migrateLock = "delaybridge_migrate"

// Migrate applies every embedded migration the database has not seen yet and
// returns the versions it applied. It is idempotent and safe to run from
// several processes at once: a named lock serialises them. Each migration
// is written to survive a crash halfway (CREATE ... IF NOT EXISTS), because
// MySQL commits DDL statement by statement.
func Migrate(ctx context.Context, db *sql.DB) ([]int, error) {
	migs, err := Migrations()
	if err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: migrate: %w", err)
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 60)", migrateLock).Scan(&got); err != nil {
		return nil, fmt.Errorf("outbox: migrate: take lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return nil, fmt.Errorf("outbox: migrate: another migrator held %q for 60s", migrateLock)
	}
	defer conn.ExecContext(context.Background(), "SELECT RELEASE_LOCK(?)", migrateLock) //nolint:errcheck // released with the connection anyway

	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS delaybridge_migration (
  version    INT NOT NULL PRIMARY KEY,
  name       VARCHAR(255) NOT NULL,
  applied_ms BIGINT NOT NULL
) ENGINE = InnoDB`); err != nil {
		return nil, fmt.Errorf("outbox: migrate: %w", err)
	}
	done := map[int]bool{}
	rows, err := conn.QueryContext(ctx, "SELECT version FROM delaybridge_migration")
	if err != nil {
		return nil, fmt.Errorf("outbox: migrate: %w", err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return nil, err
		}
		done[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	var applied []int
	for _, m := range migs {
		if done[m.Version] {
			continue
		}
		for _, stmt := range splitStatements(m.SQL) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil && !alreadyApplied(err) {
				return applied, fmt.Errorf("outbox: migration %s: %w", m.Name, err)
			}
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO delaybridge_migration (version, name, applied_ms) VALUES (?, ?, ?)",
			m.Version, m.Name, time.Now().UnixMilli()); err != nil {
			return applied, fmt.Errorf("outbox: record migration %s: %w", m.Name, err)
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

// splitStatements splits a migration on semicolons that end a line, dropping
// comment-only chunks. Migrations contain no procedures, so this suffices.
func splitStatements(script string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(script, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") || trimmed == "" {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// alreadyApplied reports the error of an ALTER that a migrator killed
// before it recorded the migration already ran: a column that exists
// (MySQL error 1060), an index that exists (1061), or an index or column
// to drop that is gone (1091). MySQL has no ADD INDEX IF NOT EXISTS nor
// DROP INDEX IF EXISTS, so this is how a migration that adds or drops
// columns or indexes stays safe to run again.
func alreadyApplied(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1060 || me.Number == 1061 || me.Number == 1091)
}
