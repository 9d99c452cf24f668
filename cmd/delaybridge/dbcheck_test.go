package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestDoctor_ProbesThatSkipLockedReallySkips(t *testing.T) {
	dsn := scratch(t)
	out := mustRun(t, append([]string{"doctor", "--mysql-dsn", dsn, "--log-level", "error"}, testenv.RabbitFlags(t)...)...)
	if !strings.Contains(out, "OK    database MariaDB 1") || !strings.Contains(out, "FOR UPDATE SKIP LOCKED skips a row another connection holds (probed); binary log") {
		t.Fatalf("doctor:\n%s", out)
	}
}

// run checks the database before it touches the broker: an empty
// database has no schema, and the error says to migrate.
func TestRun_RefusesADatabaseItCannotProbe(t *testing.T) {
	_, bare := testenv.ScratchDB(t)
	_, _, err := run(t, append([]string{"run", "--mysql-dsn", bare, "--http", testenv.FreeAddr(t), "--log-level", "error"}, testenv.RabbitFlags(t)...)...)
	if !errors.Is(err, outbox.ErrSchemaBehind) || !strings.Contains(err.Error(), "run delaybridge migrate") {
		t.Fatalf("run on an unmigrated database: %v", err)
	}
}
