package main

import (
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestDoctor_ProbesThatSkipLockedReallySkips(t *testing.T) {
	dsn := scratch(t)
	out := mustRun(t, append([]string{"doctor", "--mysql-dsn", dsn, "--log-level", "error"}, rabbitFlags(t)...)...)
	if !strings.Contains(out, "OK    database MariaDB 1") || !strings.Contains(out, "FOR UPDATE SKIP LOCKED skips a row another connection holds (probed); binary log") {
		t.Fatalf("doctor:\n%s", out)
	}
}

// run checks the database before it touches the broker: on an empty
// database the SKIP LOCKED probe has no schema to probe and says so.
func TestRun_RefusesADatabaseItCannotProbe(t *testing.T) {
	_, bare := testenv.ScratchDB(t)
	_, _, err := run(t, append([]string{"run", "--mysql-dsn", bare, "--http", testenv.FreeAddr(t), "--log-level", "error"}, rabbitFlags(t)...)...)
	if err == nil || !strings.Contains(err.Error(), "SKIP LOCKED probe needs the migrated schema (run delaybridge migrate)") {
		t.Fatalf("run on an unmigrated database: %v", err)
	}
}
