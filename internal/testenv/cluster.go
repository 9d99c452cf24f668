package testenv

// Extra servers for the tests of deployed shapes, started and stopped by
// scripts/cluster.sh: only the tests that need them pay for them.

import (
	"net"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// Cluster runs scripts/cluster.sh with args and fails the test with its
// output when it fails.
func Cluster(t testing.TB, args ...string) string {
	t.Helper()
	root := moduleRoot(t)
	cmd := exec.Command(filepath.Join(root, "scripts", "cluster.sh"), args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/cluster.sh %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// Shard2Port is the port of the second MariaDB server
// (DELAYBRIDGE_SHARD2_PORT, default 3307, as in scripts/cluster.sh).
func Shard2Port() string { return envOr("DELAYBRIDGE_SHARD2_PORT", "3307") }

// Shard2 starts the second MariaDB server, an outbox shard of its own,
// stops it at cleanup, and returns the DSN of its delaybridge database.
func Shard2(t testing.TB) string {
	t.Helper()
	Cluster(t, "shard", "up")
	t.Cleanup(func() { Cluster(t, "shard", "down") })
	cfg, err := mysql.ParseDSN(MySQLDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = "127.0.0.1:" + Shard2Port()
	cfg.DBName = "delaybridge"
	return cfg.FormatDSN()
}

// Shard2Kill kills the second MariaDB server with SIGKILL; nothing restarts
// it until Shard2Start.
func Shard2Kill(t testing.TB) { t.Helper(); Cluster(t, "shard", "kill") }

// Shard2Start starts the second MariaDB server again (InnoDB recovers from
// its redo log) and returns once it answers.
func Shard2Start(t testing.TB) { t.Helper(); Cluster(t, "shard", "up") }

// FreeAddr returns a loopback address with a port free at the moment, for a
// server a test starts.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
