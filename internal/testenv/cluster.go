package testenv

// Extra servers for the tests of deployed shapes, started and stopped by
// scripts/cluster.sh: only the tests that need them pay for them.

import (
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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

// RabbitCluster is the 3-node RabbitMQ cluster of scripts/cluster.sh.
type RabbitCluster struct {
	// URLs are the nodes' AMQP URLs, node 1 first.
	URLs []string
	// Nodes are the Erlang node names, in the same order.
	Nodes []string
}

// StartRabbitCluster starts a fresh 3-node RabbitMQ cluster and deletes it
// at cleanup.
func StartRabbitCluster(t testing.TB) RabbitCluster {
	t.Helper()
	t.Cleanup(func() { Cluster(t, "rabbit", "down") })
	Cluster(t, "rabbit", "up")
	var c RabbitCluster
	for _, line := range strings.Split(Cluster(t, "rabbit", "env"), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		v = strings.Trim(v, "'")
		switch k {
		case "DELAYBRIDGE_CLUSTER_AMQP_URLS":
			c.URLs = strings.Split(v, ",")
		case "DELAYBRIDGE_CLUSTER_NODES":
			c.Nodes = strings.Split(v, ",")
		}
	}
	if len(c.URLs) != 3 || len(c.Nodes) != 3 {
		t.Fatalf("scripts/cluster.sh rabbit env: want 3 URLs and 3 nodes, got %q and %q", c.URLs, c.Nodes)
	}
	return c
}

// Ctl runs rabbitmqctl against node i (0-2) of the cluster.
func (c RabbitCluster) Ctl(t testing.TB, i int, args ...string) string {
	t.Helper()
	return Rabbitmqctl(t, append([]string{"-q", "-n", c.Nodes[i]}, args...)...)
}

// Kill kills node i (0-2) with SIGKILL; Start brings it back.
func (c RabbitCluster) Kill(t testing.TB, i int) {
	t.Helper()
	Cluster(t, "rabbit", "kill", strconv.Itoa(i+1))
}

// Start starts node i (0-2) again; it rejoins the cluster.
func (c RabbitCluster) Start(t testing.TB, i int) {
	t.Helper()
	Cluster(t, "rabbit", "start", strconv.Itoa(i+1))
}
