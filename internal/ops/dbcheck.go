package ops

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
)

// ErrUnsupportedDatabase reports a database the relay cannot claim rows on
// safely: one without FOR UPDATE SKIP LOCKED, one that accepts the syntax
// without taking row locks (two relays could then claim the same row), or
// one that writes the claims to a statement-based binary log.
var ErrUnsupportedDatabase = errors.New("outbox: unsupported database")

// Database is what CheckDatabase learned about a server.
type Database struct {
	// Product is "MariaDB", "MySQL" or "TiDB" (Percona Server and other
	// MySQL builds count as MySQL).
	Product string
	// Version is VERSION() as the server reported it.
	Version string
	// Major, Minor and Patch are the product's own version numbers: for
	// TiDB its release (v7.5.1), not the MySQL version it emulates.
	Major, Minor, Patch int
	// BinlogOn is @@log_bin; BinlogFormat is the session's @@binlog_format
	// (STATEMENT, MIXED or ROW).
	BinlogOn     bool
	BinlogFormat string
}

func (d Database) String() string { return d.Product + " " + d.Version }

// ParseVersion reads a VERSION() string, with @@version_comment as a hint
// for the product, into a Database without binary-log settings.
func ParseVersion(version, comment string) (Database, error) {
	d := Database{Version: version}
	v := strings.TrimSpace(version)
	lower := strings.ToLower(v)
	switch {
	case strings.Contains(lower, "tidb"):
		d.Product = "TiDB"
		// "8.0.11-TiDB-v7.5.1": the release follows "TiDB-v".
		if i := strings.Index(lower, "tidb-v"); i >= 0 {
			v = v[i+len("tidb-v"):]
		} else {
			v = ""
		}
	case strings.Contains(lower, "mariadb") || strings.Contains(strings.ToLower(comment), "mariadb"):
		d.Product = "MariaDB"
		// Servers that speak to old replicas report "5.5.5-10.3.39-MariaDB".
		v = strings.TrimPrefix(v, "5.5.5-")
	default:
		d.Product = "MySQL"
	}
	nums, ok := leadingVersion(v)
	if !ok {
		return d, fmt.Errorf("%w: cannot read the version of %s %q", ErrUnsupportedDatabase, d.Product, version)
	}
	d.Major, d.Minor, d.Patch = nums[0], nums[1], nums[2]
	return d, nil
}

// leadingVersion reads "X.Y" or "X.Y.Z" at the start of s, ignoring what
// follows the numbers ("-log", "-MariaDB-0+deb12u1", "-dmr").
func leadingVersion(s string) ([3]int, bool) {
	var out [3]int
	i := 0
	for part := 0; part < 3; part++ {
		j := i
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i || j-i > 6 {
			return out, part >= 2
		}
		out[part], _ = strconv.Atoi(s[i:j])
		if j == len(s) || s[j] != '.' {
			return out, part >= 1
		}
		i = j + 1
	}
	return out, true
}

// Check says whether the relay can claim rows on d safely, naming the
// product and version when it cannot.
func (d Database) Check() error {
	switch d.Product {
	case "TiDB":
		return fmt.Errorf("%w: %s accepts FOR UPDATE SKIP LOCKED but takes no row lock for it, so two relays could claim the same task; use MySQL 8.0.1+ or MariaDB 10.6+", ErrUnsupportedDatabase, d)
	case "MariaDB":
		if d.Major < 10 || d.Major == 10 && d.Minor < 6 {
			return fmt.Errorf("%w: %s has no FOR UPDATE SKIP LOCKED (MariaDB added it in 10.6); upgrade to MariaDB 10.6+", ErrUnsupportedDatabase, d)
		}
	default:
		if d.Major < 8 || d.Major == 8 && d.Minor == 0 && d.Patch < 1 {
			return fmt.Errorf("%w: %s has no FOR UPDATE SKIP LOCKED (MySQL added it in 8.0.1); upgrade to MySQL 8.0.1+", ErrUnsupportedDatabase, d)
		}
	}
	if d.BinlogOn && strings.EqualFold(d.BinlogFormat, "STATEMENT") {
		return fmt.Errorf("%w: %s writes a statement-based binary log (binlog_format=STATEMENT), where FOR UPDATE SKIP LOCKED is unsafe (a replica may pick other rows); set binlog_format=ROW (or MIXED)", ErrUnsupportedDatabase, d)
	}
	return nil
}

// InspectDatabase asks the server behind db for its product, version and
// binary-log settings.
func InspectDatabase(ctx context.Context, db *sql.DB) (Database, error) {
	var version, comment string
	if err := db.QueryRowContext(ctx, "SELECT VERSION(), @@version_comment").Scan(&version, &comment); err != nil {
		return Database{}, fmt.Errorf("outbox: read the database version: %w", err)
	}
	d, err := ParseVersion(version, comment)
	if err != nil || d.Product == "TiDB" {
		return d, err
	}
	var logBin sql.NullInt64
	var format sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT @@log_bin, @@SESSION.binlog_format").Scan(&logBin, &format); err != nil {
		return d, fmt.Errorf("outbox: read the binary log settings of %s: %w", d, err)
	}
	d.BinlogOn, d.BinlogFormat = logBin.Int64 != 0, format.String
	return d, nil
}

// CheckDatabase inspects the server behind db and returns an error matching
// ErrUnsupportedDatabase when the relay cannot claim rows on it safely,
// and one matching outbox.ErrSchemaBehind when the schema lacks a
// migration this binary ships (outbox.CheckSchema). Past both, it proves
// that SKIP LOCKED really skips: it locks a row of delaybridge_migration
// on one connection and claims it with SKIP LOCKED on another, which must
// come back empty. It needs two connections of db's pool for a moment.
func CheckDatabase(ctx context.Context, db *sql.DB) (Database, error) {
	d, err := InspectDatabase(ctx, db)
	if err != nil {
		return d, err
	}
	if err := d.Check(); err != nil {
		return d, err
	}
	if err := outbox.CheckSchema(ctx, db); err != nil {
		return d, err
	}
	return d, ProbeSkipLocked(ctx, db)
}

// probeLock is the named lock that serialises SKIP LOCKED probes.
const probeLock = "delaybridge_skip_locked_probe"

// probeWait bounds the lock wait of the probe's SKIP LOCKED claim: one that
// waits for the lock instead of skipping the row fails after it.
const probeWait = 2 * time.Second

// ProbeSkipLocked locks the first row of delaybridge_migration on one
// connection and reads it with FOR UPDATE SKIP LOCKED on a second. The
// second must first see the row while it is free, then skip it while it is
// locked: a database that returns the locked row, or waits for the lock,
// does not skip locked rows and fails with ErrUnsupportedDatabase. Both
// transactions roll back. Probes run one at a time (a named lock), so
// daemons starting together do not mistake each other's lock for the
// database's. The schema must be migrated.
func ProbeSkipLocked(ctx context.Context, db *sql.DB) error {
	ctx, cancel := context.WithTimeout(ctx, 4*probeWait)
	defer cancel()
	var first int
	if err := db.QueryRowContext(ctx, "SELECT MIN(version) FROM delaybridge_migration").Scan(&first); err != nil {
		return fmt.Errorf("outbox: SKIP LOCKED probe needs the migrated schema (run delaybridge migrate): %w", err)
	}
	claimer, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("outbox: SKIP LOCKED probe: %w", err)
	}
	defer claimer.Close()
	// Daemons starting together probe the same row: one at a time, or one's
	// lock would look like the other's database not skipping.
	var got sql.NullInt64
	if err := claimer.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", probeLock, int(2*probeWait/time.Second)).Scan(&got); err != nil || got.Int64 != 1 {
		return fmt.Errorf("outbox: SKIP LOCKED probe: another probe holds %s: %v", probeLock, err)
	}
	defer func() {
		_, _ = claimer.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK(?)", probeLock)
	}()
	// A claim that waits for the lock rather than skipping the row gives up
	// after probeWait; the session's own setting is restored after.
	if _, err := claimer.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = ?", int(probeWait/time.Second)); err != nil {
		return fmt.Errorf("outbox: SKIP LOCKED probe: %w", err)
	}
	defer func() {
		_, _ = claimer.ExecContext(context.WithoutCancel(ctx), "SET SESSION innodb_lock_wait_timeout = DEFAULT")
	}()
	claim := func() (int, error) {
		tx, err := claimer.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		defer func() { _ = tx.Rollback() }()
		var n int
		rows, err := tx.QueryContext(ctx, "SELECT version FROM delaybridge_migration WHERE version = ? FOR UPDATE SKIP LOCKED", first)
		if err != nil {
			return 0, err
		}
		defer rows.Close()
		for rows.Next() {
			n++
		}
		return n, rows.Err()
	}
	if n, err := claim(); err != nil || n != 1 {
		return fmt.Errorf("%w: SKIP LOCKED probe: a claim of a free row returned %d rows, err %v", ErrUnsupportedDatabase, n, err)
	}
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox: SKIP LOCKED probe: %w", err)
	}
	defer func() { _ = holder.Rollback() }()
	var locked int
	if err := holder.QueryRowContext(ctx, "SELECT version FROM delaybridge_migration WHERE version = ? FOR UPDATE", first).Scan(&locked); err != nil {
		return fmt.Errorf("outbox: SKIP LOCKED probe: lock a row: %w", err)
	}
	switch n, err := claim(); {
	case err != nil:
		return fmt.Errorf("%w: FOR UPDATE SKIP LOCKED waited for a locked row instead of skipping it: %v", ErrUnsupportedDatabase, err)
	case n != 0:
		return fmt.Errorf("%w: FOR UPDATE SKIP LOCKED returned a row another transaction holds locked: two relays could claim the same task", ErrUnsupportedDatabase)
	}
	return nil
}
