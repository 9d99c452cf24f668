package delaybridge_test

import (
	"context"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// A DSN that names no database is refused when the database is opened,
// with the form wanted, not accepted until migrate or the first query
// fails with "No database selected". The server would take it: the test
// uses the real one.
func TestOpenDB_ADSNWithoutADatabaseIsRefused(t *testing.T) {
	testenv.MySQL(t)
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = ""
	db, err := delaybridge.Config{MySQLDSN: cfg.FormatDSN()}.OpenDB(context.Background())
	if err == nil {
		db.Close()
		t.Fatal("OpenDB with a DSN naming no database succeeded")
	}
	if !strings.Contains(err.Error(), "names no database") || !strings.Contains(err.Error(), "user:password@tcp(host:3306)/dbname") {
		t.Errorf("OpenDB without a database: %v, want it to say so and show the form", err)
	}
	if cfg.Passwd != "" && strings.Contains(err.Error(), ":"+cfg.Passwd+"@") {
		t.Errorf("the error shows the password: %v", err)
	}
}
