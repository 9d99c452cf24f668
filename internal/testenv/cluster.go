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

// RocketCluster is the RocketMQ profile of scripts/cluster.sh: a name
// server of its own and two broker groups, broker-a and broker-b, one
// master each.
type RocketCluster struct {
	// NameServer is the profile's name server, host:port.
	NameServer string
	// Brokers are the brokers' addresses, broker-a first.
	Brokers []string
	// Names are the broker names, in the same order.
	Names []string
	// Cluster is the broker cluster's name, for mqadmin -c.
	Cluster string
}

// StartRocketCluster starts the RocketMQ profile (or reuses a running one)
// and stops it, deleting its data, at cleanup.
func StartRocketCluster(t testing.TB) RocketCluster {
	t.Helper()
	t.Cleanup(func() { Cluster(t, "rocket", "down") })
	Cluster(t, "rocket", "up")
	var c RocketCluster
	for _, line := range strings.Split(Cluster(t, "rocket", "env"), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		v = strings.Trim(v, "'")
		switch k {
		case "DELAYBRIDGE_CLUSTER_ROCKETMQ_NAMESRV":
			c.NameServer = v
		case "DELAYBRIDGE_CLUSTER_ROCKETMQ_CLUSTER":
			c.Cluster = v
		case "DELAYBRIDGE_CLUSTER_ROCKETMQ_BROKERS":
			for _, b := range strings.Split(v, ",") {
				name, addr, _ := strings.Cut(b, "=")
				c.Names = append(c.Names, name)
				c.Brokers = append(c.Brokers, addr)
			}
		}
	}
	if c.NameServer == "" || c.Cluster == "" || len(c.Brokers) != 2 {
		t.Fatalf("scripts/cluster.sh rocket env: want a name server, a cluster and 2 brokers, got %+v", c)
	}
	return c
}

// letter is the broker's argument to scripts/cluster.sh: a or b.
func (c RocketCluster) letter(i int) string { return strings.TrimPrefix(c.Names[i], "broker-") }

// Kill kills broker i (0 or 1) with SIGKILL; nothing restarts it until
// Start.
func (c RocketCluster) Kill(t testing.TB, i int) {
	t.Helper()
	Cluster(t, "rocket", "kill", c.letter(i))
}

// Start starts broker i (0 or 1) again on its store and returns once the
// name server lists it.
func (c RocketCluster) Start(t testing.TB, i int) {
	t.Helper()
	Cluster(t, "rocket", "start", c.letter(i))
}
