package testenv

import (
	"database/sql"
	"testing"
)

// MustExec runs query on db and fails t if it fails.
func MustExec(t testing.TB, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.Exec(query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}
