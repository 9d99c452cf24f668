package main

import (
	"context"
	"database/sql"
	"net"
	"time"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

func checkDatabase(ctx context.Context, a *app, r *report) {
	db, err := a.openDB(ctx)
	if err != nil {
		r.fail("database: %v", err)
		return
	}
	defer db.Close()
	d, err := ops.InspectDatabase(ctx, db)
	if err != nil {
		r.fail("database: %v", err)
		return
	}
	checkDatabaseTransport(ctx, a, db, r)
	unsafe := d.Check()
	if unsafe != nil {
		r.fail("database: %v", unsafe)
	}
	var applied sql.NullInt64
	migs, merr := outbox.Migrations()
	switch err := db.QueryRowContext(ctx, "SELECT MAX(version) FROM delaybridge_migration").Scan(&applied); {
	case err != nil || !applied.Valid:
		r.fail("outbox schema not migrated: run delaybridge migrate")
	case merr != nil:
		r.fail("embedded migrations: %v", merr)
	case applied.Int64 < int64(migs[len(migs)-1].Version):
		r.fail("outbox schema at version %d, this binary needs %d: run delaybridge migrate", applied.Int64, migs[len(migs)-1].Version)
	default:
		r.ok("outbox schema at version %d", applied.Int64)
		defer checkProcesses(ctx, db, r)
		if unsafe != nil {
			break
		}
		if err := ops.ProbeSkipLocked(ctx, db); err != nil {
			r.fail("database %s: %v", d, err)
		} else {
			r.ok("database %s: FOR UPDATE SKIP LOCKED skips a row another connection holds (probed)%s", d, binlogNote(d))
		}
	}
	before := time.Now()
	var dbMS int64
	if err := db.QueryRowContext(ctx, "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)").Scan(&dbMS); err == nil {
		after := time.Now()
		mid := before.Add(after.Sub(before) / 2)
		skew := time.UnixMilli(dbMS).Sub(mid)
		if skew.Abs() > time.Second {
			r.warn("database clock differs from this host by %v (only delaybridge's own clocks decide due times, but logs will disagree)", skew.Round(time.Millisecond))
		} else {
			r.ok("database clock within %v of this host", skew.Abs().Round(time.Millisecond)+time.Millisecond)
		}
	}
}

// checkProcesses reports what the live presences of relays and consumers
// say: broker topologies that differ fail (the tasks of one sit in queues
// the other never reads; a consumer refuses to start so, a relay only
// logs it), and pending tasks past due warn, more loudly with no live
// relay.
func checkProcesses(ctx context.Context, db *sql.DB, r *report) {
	st, err := ops.ReadStats(ctx, db, time.Now(), doctorGrace, 0)
	if err != nil {
		r.warn("live processes: %v", err)
		return
	}
	p, err := cli.ReadProcesses(ctx, db, st)
	if err != nil {
		r.warn("live processes: %v", err)
		return
	}
	for _, m := range p.Mismatches {
		r.fail("broker topology differs between live processes: %s: tasks may sit in queues nobody reads", cli.Printable(m))
	}
	if len(p.Mismatches) == 0 {
		r.ok("live processes: %d relay(s) and %d consumer(s), no broker topology differs between them", p.LiveRelays, p.LiveConsumers)
	}
	switch {
	case p.NoRelay:
		r.warn("%d pending tasks more than %v past due and no live relay: start `delaybridge run`", p.OverduePending, doctorGrace)
	case p.OverduePending > 0:
		r.warn("%d pending tasks more than %v past due though %d relay(s) are live: the relay's publishes fail or it is behind (see its log)", p.OverduePending, doctorGrace, p.LiveRelays)
	}
}

// doctorGrace is how far past due a pending task must be for doctor to
// warn of it: status's default --grace.
const doctorGrace = 30 * time.Second

// checkDatabaseTransport says whether the outbox connection is encrypted,
// and warns when it is not and leaves this host, or when it is encrypted
// without verifying the server (tls=skip-verify or tls=preferred in the
// DSN), which an active man in the middle defeats.
func checkDatabaseTransport(ctx context.Context, a *app, db *sql.DB, r *report) {
	var name, cipher string
	if err := db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher); err != nil {
		r.warn("database: cannot tell whether the connection is encrypted: %v", err)
		return
	}
	cfg, err := a.mysqlConfig()
	if err != nil {
		return
	}
	switch {
	case cipher != "" && cfg.TLS != nil && cfg.TLS.InsecureSkipVerify:
		r.warn("database connection uses TLS (cipher %s) but does not verify the server's certificate (tls=%s in the DSN): use --mysql-tls-ca or tls=true (see SECURITY.md)", cipher, cfg.TLSConfig)
	case cipher != "":
		r.ok("database connection uses TLS (cipher %s)", cipher)
	case cfg.Net == "unix":
	default:
		if host, _, err := net.SplitHostPort(cfg.Addr); err == nil && !isLoopback(host) {
			r.warn("database connection to %s is not encrypted: set --mysql-tls-ca or tls=true in the DSN (see SECURITY.md)", cfg.Addr)
		}
	}
}

// isLoopback reports whether host names this machine.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// binlogNote says what doctor found about the binary log.
func binlogNote(d ops.Database) string {
	if !d.BinlogOn {
		return "; binary log off"
	}
	return "; binary log format " + d.BinlogFormat
}
