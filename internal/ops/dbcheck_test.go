package ops_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestParseVersion_DecidesFromRealVersionStrings(t *testing.T) {
	for _, c := range []struct {
		version, comment string
		product          string
		major, minor     int
		ok               bool   // Check passes
		says             string // in Check's error
	}{
		{"10.11.19-MariaDB-0+deb12u1", "Debian 12", "MariaDB", 10, 11, true, ""},
		{"10.6.16-MariaDB", "MariaDB Server", "MariaDB", 10, 6, true, ""},
		{"11.4.2-MariaDB-ubu2404", "mariadb.org binary distribution", "MariaDB", 11, 4, true, ""},
		{"10.5.23-MariaDB-0+deb11u1", "Debian 11", "MariaDB", 10, 5, false, "MariaDB 10.5.23-MariaDB-0+deb11u1 has no FOR UPDATE SKIP LOCKED"},
		{"5.5.5-10.3.39-MariaDB-0ubuntu0.20.04.2", "Ubuntu 20.04", "MariaDB", 10, 3, false, "MariaDB added it in 10.6"},
		{"10.4.32-MariaDB-log", "MariaDB Server", "MariaDB", 10, 4, false, "upgrade to MariaDB 10.6+"},
		{"8.0.36", "MySQL Community Server - GPL", "MySQL", 8, 0, true, ""},
		{"8.4.0", "MySQL Community Server - GPL", "MySQL", 8, 4, true, ""},
		{"9.1.0-commercial", "MySQL Enterprise Server - Commercial", "MySQL", 9, 1, true, ""},
		{"8.0.35-27", "Percona Server (GPL), Release 27, Revision 2f8eeab2", "MySQL", 8, 0, true, ""},
		{"8.0.0-dmr", "MySQL Community Server (GPL)", "MySQL", 8, 0, false, "MySQL 8.0.0-dmr has no FOR UPDATE SKIP LOCKED (MySQL added it in 8.0.1)"},
		{"5.7.44-log", "MySQL Community Server (GPL)", "MySQL", 5, 7, false, "upgrade to MySQL 8.0.1+"},
		{"5.6.51", "MySQL Community Server (GPL)", "MySQL", 5, 6, false, "MySQL 5.6.51 has no FOR UPDATE SKIP LOCKED"},
		{"8.0.11-TiDB-v7.5.1", "", "TiDB", 7, 5, false, "TiDB 8.0.11-TiDB-v7.5.1 accepts FOR UPDATE SKIP LOCKED but takes no row lock"},
		{"5.7.25-TiDB-v6.5.0", "", "TiDB", 6, 5, false, "two relays could claim the same task"},
	} {
		t.Run(c.version, func(t *testing.T) {
			d, err := ops.ParseVersion(c.version, c.comment)
			if err != nil {
				t.Fatal(err)
			}
			if d.Product != c.product || d.Major != c.major || d.Minor != c.minor || d.Version != c.version {
				t.Errorf("ParseVersion = %+v, want %s %d.%d", d, c.product, c.major, c.minor)
			}
			err = d.Check()
			switch {
			case c.ok && err != nil:
				t.Errorf("Check = %v, want nil", err)
			case !c.ok && (!errors.Is(err, ops.ErrUnsupportedDatabase) || !strings.Contains(err.Error(), c.says)):
				t.Errorf("Check = %v, want ErrUnsupportedDatabase saying %q", err, c.says)
			}
		})
	}
}

func TestParseVersion_UnreadableVersionIsAnError(t *testing.T) {
	for _, v := range []string{"", "MariaDB", "8", "x.y.z", "8.0.11-TiDB"} {
		if d, err := ops.ParseVersion(v, ""); !errors.Is(err, ops.ErrUnsupportedDatabase) {
			t.Errorf("ParseVersion(%q) = %+v, %v; want ErrUnsupportedDatabase", v, d, err)
		}
	}
}

func TestDatabaseCheck_StatementBinlogIsRefused(t *testing.T) {
	for _, c := range []struct {
		on     bool
		format string
		ok     bool
	}{
		{true, "STATEMENT", false}, {true, "statement", false}, {true, "MIXED", true}, {true, "ROW", true},
		{false, "STATEMENT", true}, {false, "MIXED", true},
	} {
		for _, v := range []string{"10.11.19-MariaDB-0+deb12u1", "8.0.36"} {
			d, err := ops.ParseVersion(v, "")
			if err != nil {
				t.Fatal(err)
			}
			d.BinlogOn, d.BinlogFormat = c.on, c.format
			err = d.Check()
			if c.ok != (err == nil) || (err != nil && (!errors.Is(err, ops.ErrUnsupportedDatabase) || !strings.Contains(err.Error(), "binlog_format=STATEMENT") || !strings.Contains(err.Error(), v))) {
				t.Errorf("%s, log_bin %v, binlog_format %s: Check = %v, want ok %v", v, c.on, c.format, err, c.ok)
			}
		}
	}
}

func TestCheckDatabase_AcceptsTheTestMariaDBAndItsLocksReallySkip(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	d, err := ops.CheckDatabase(ctx, b.db)
	if err != nil {
		t.Fatalf("CheckDatabase = %+v, %v", d, err)
	}
	var version, format string
	var logBin int
	if err := b.db.QueryRowContext(ctx, "SELECT VERSION(), @@log_bin, @@SESSION.binlog_format").Scan(&version, &logBin, &format); err != nil {
		t.Fatal(err)
	}
	if d.Product != "MariaDB" || d.Version != version || d.BinlogOn != (logBin == 1) || d.BinlogFormat != format || d.Major < 10 {
		t.Errorf("CheckDatabase = %+v; the server says %s, log_bin %d, binlog_format %s", d, version, logBin, format)
	}

	// The same claim the probe makes, on the outbox itself: a task one
	// transaction holds is invisible to a second's SKIP LOCKED claim, which
	// takes the free one.
	id1 := b.schedule(t, outbox.Task{Topic: "skip", Key: "held", DueAt: time.Now()})
	id2 := b.schedule(t, outbox.Task{Topic: "skip", Key: "free", DueAt: time.Now()})
	holder, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	var got int64
	if err := holder.QueryRowContext(ctx, "SELECT id FROM delay_task WHERE id = ? FOR UPDATE", id1).Scan(&got); err != nil {
		t.Fatal(err)
	}
	claimer, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer claimer.Rollback()
	rows, err := claimer.QueryContext(ctx, "SELECT id FROM delay_task WHERE topic = 'skip' ORDER BY id FOR UPDATE SKIP LOCKED")
	if err != nil {
		t.Fatal(err)
	}
	var claimed []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		claimed = append(claimed, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 1 || claimed[0] != id2 {
		t.Errorf("the second connection claimed %v with SKIP LOCKED, want only the free task %d (task %d is held)", claimed, id2, id1)
	}
}

func TestProbeSkipLocked_NeedsTheMigratedSchema(t *testing.T) {
	db, _ := testenv.ScratchDB(t)
	err := ops.ProbeSkipLocked(context.Background(), db)
	if err == nil || !strings.Contains(err.Error(), "delaybridge migrate") {
		t.Errorf("ProbeSkipLocked on an empty database = %v, want an error saying to migrate", err)
	}
}

// Daemons starting together probe the same row; none may mistake another's
// lock for a database that does not skip.
func TestProbeSkipLocked_ConcurrentProbesAllPass(t *testing.T) {
	b := setup(t)
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- ops.ProbeSkipLocked(b.ctx, b.db) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// A database that lacks a migration this binary ships is refused before a
// daemon starts, naming the migration and the fix; one with no migration
// table at all too.
func TestCheckDatabase_RefusesASchemaOlderThanTheBinary(t *testing.T) {
	db, _ := testenv.ScratchDB(t)
	ctx := context.Background()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := outbox.CheckSchema(ctx, db); err != nil {
		t.Fatalf("CheckSchema on a migrated database = %v", err)
	}
	migs, err := outbox.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	last := migs[len(migs)-1]
	if _, err := db.ExecContext(ctx, "DELETE FROM delaybridge_migration WHERE version = ?", last.Version); err != nil {
		t.Fatal(err)
	}
	_, err = ops.CheckDatabase(ctx, db)
	if !errors.Is(err, outbox.ErrSchemaBehind) || !strings.Contains(err.Error(), last.Name) || !strings.Contains(err.Error(), "run delaybridge migrate") {
		t.Fatalf("CheckDatabase without %s = %v; want ErrSchemaBehind naming it and the fix", last.Name, err)
	}
	if _, err := db.ExecContext(ctx, "DROP TABLE delaybridge_migration"); err != nil {
		t.Fatal(err)
	}
	if err := outbox.CheckSchema(ctx, db); !errors.Is(err, outbox.ErrSchemaBehind) || !strings.Contains(err.Error(), "run delaybridge migrate") {
		t.Fatalf("CheckSchema with no migration table = %v; want ErrSchemaBehind", err)
	}
	// A database it cannot read is no schema to migrate.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := outbox.CheckSchema(done, db); err == nil || errors.Is(err, outbox.ErrSchemaBehind) || strings.Contains(err.Error(), "migrate") {
		t.Errorf("CheckSchema with a done context = %v; want its error, not ErrSchemaBehind", err)
	}
	db.Close()
	if err := outbox.CheckSchema(ctx, db); err == nil || errors.Is(err, outbox.ErrSchemaBehind) {
		t.Errorf("CheckSchema on a closed pool = %v; want its error, not ErrSchemaBehind", err)
	}
}
