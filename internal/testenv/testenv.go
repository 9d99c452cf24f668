// Package testenv connects tests to the local services that
// scripts/services.sh starts. Settings come from the environment that
// `scripts/services.sh env` prints; unset, they default to exactly what that
// script sets up. When a service cannot be reached the test fails under
// CI=true, where every service must be up, and is skipped elsewhere, so `go
// test ./...` on a laptop without services stays green.
package testenv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Defaults equal to what scripts/services.sh sets up.
const (
	DefaultMySQLDSN = "delaybridge:delaybridge@tcp(127.0.0.1:3306)/delaybridge?parseTime=true&multiStatements=true"
	DefaultAMQPURL  = "amqp://delaybridge:delaybridge@127.0.0.1:5672/"
	DefaultNamesrv  = "127.0.0.1:9876"
	// DefaultRocketBroker is the local RocketMQ broker's address.
	DefaultRocketBroker = "127.0.0.1:10911"
)

const reachTimeout = 5 * time.Second

// createTimeout bounds creating a scratch database on a server that
// answered: a loaded machine can stall the statement for seconds.
const createTimeout = 30 * time.Second

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// MySQLDSN returns DELAYBRIDGE_MYSQL_DSN or the default.
func MySQLDSN() string { return envOr("DELAYBRIDGE_MYSQL_DSN", DefaultMySQLDSN) }

// RocketBrokerAddr returns DELAYBRIDGE_ROCKETMQ_BROKER_ADDR or the default:
// the broker tests create topics on and the fault tests stop.
func RocketBrokerAddr() string {
	return envOr("DELAYBRIDGE_ROCKETMQ_BROKER_ADDR", DefaultRocketBroker)
}

// AMQPURL returns DELAYBRIDGE_AMQP_URL or the default.
func AMQPURL() string { return envOr("DELAYBRIDGE_AMQP_URL", DefaultAMQPURL) }

// Namesrv returns DELAYBRIDGE_ROCKETMQ_NAMESRV or the default.
func Namesrv() string { return envOr("DELAYBRIDGE_ROCKETMQ_NAMESRV", DefaultNamesrv) }

// Unreachable fails the test under CI=true and skips it elsewhere, naming
// the service and where it was looked for.
func Unreachable(t testing.TB, service, where string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s unreachable at %s: %v (run scripts/services.sh up)", service, where, err)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// MySQL returns a pool on the delaybridge database, closed at cleanup.
func MySQL(t testing.TB) *sql.DB {
	t.Helper()
	dsn := MySQLDSN()
	where := "DELAYBRIDGE_MYSQL_DSN"
	if cfg, err := mysql.ParseDSN(dsn); err == nil {
		where = fmt.Sprintf("%s@%s/%s", cfg.User, cfg.Addr, cfg.DBName)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		Unreachable(t, "MariaDB", where, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), reachTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		Unreachable(t, "MariaDB", where, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// AMQP checks RabbitMQ is reachable and returns its URL.
func AMQP(t testing.TB) string {
	t.Helper()
	raw := AMQPURL()
	where := "DELAYBRIDGE_AMQP_URL"
	if u, err := url.Parse(raw); err == nil {
		where = u.Redacted()
	}
	conn, err := amqp.DialConfig(raw, amqp.Config{Dial: amqp.DefaultDial(reachTimeout)})
	if err != nil {
		Unreachable(t, "RabbitMQ", where, err)
	}
	_ = conn.Close()
	return raw
}

// RocketMQ checks the RocketMQ name server accepts connections and returns
// its address.
func RocketMQ(t testing.TB) string {
	t.Helper()
	addr := Namesrv()
	conn, err := net.DialTimeout("tcp", addr, reachTimeout)
	if err != nil {
		Unreachable(t, "RocketMQ name server", addr, err)
	}
	_ = conn.Close()
	return addr
}

// Rabbitmqctl runs rabbitmqctl (DELAYBRIDGE_RABBITMQCTL, default on PATH)
// with args and returns its combined output.
func Rabbitmqctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(envOr("DELAYBRIDGE_RABBITMQCTL", "rabbitmqctl"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// MQAdmin runs RocketMQ's mqadmin (DELAYBRIDGE_MQADMIN, default
// scripts/mqadmin.sh found from the module root) with args.
func MQAdmin(t testing.TB, args ...string) string {
	t.Helper()
	bin := os.Getenv("DELAYBRIDGE_MQADMIN")
	if bin == "" {
		bin = moduleRoot(t) + "/scripts/mqadmin.sh"
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("mqadmin %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func moduleRoot(t testing.TB) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || len(out) < len("/go.mod\n") {
		t.Fatalf("cannot find the module root: %v", err)
	}
	return string(out[:len(out)-len("/go.mod\n")])
}

// Name returns prefix plus a suffix unique to this process and moment, made
// of [A-Za-z0-9_], so it is a legal table, queue and topic name alike.
func Name(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), time.Now().UnixNano())
}

// ScratchDB creates an empty database of its own for one test, returns a
// pool on it and its DSN, and drops it at cleanup.
func ScratchDB(t testing.TB) (*sql.DB, string) {
	t.Helper()
	return ScratchDBAt(t, MySQLDSN())
}

// ScratchDBAt is ScratchDB on the server of dsn (an outbox shard of its
// own): its database is made next to dsn's, with dsn's user.
func ScratchDBAt(t testing.TB, dsn string) (*sql.DB, string) {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), reachTimeout)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		Unreachable(t, "MariaDB", cfg.Addr, err)
	}
	// The server answered, so a slow CREATE DATABASE is a busy server, not
	// a missing one: it gets a bound of its own, well past reachTimeout.
	cctx, ccancel := context.WithTimeout(context.Background(), createTimeout)
	defer ccancel()
	name := fmt.Sprintf("delaybridge_t%d", rand.Uint64()%1_000_000_000_000)
	if _, err := admin.ExecContext(cctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create scratch database: %v", err)
	}
	cfg.DBName = name
	scratch := cfg.FormatDSN()
	db, err := sql.Open("mysql", scratch)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(32)
	t.Cleanup(func() {
		_ = db.Close()
		if admin, err := sql.Open("mysql", dsn); err == nil {
			_, _ = admin.Exec("DROP DATABASE IF EXISTS " + name)
			_ = admin.Close()
		}
	})
	return db, scratch
}

// DeleteRabbitPrefix deletes every queue and exchange whose name starts
// with prefix and a dot, as a test's cleanup of the topology it declared.
func DeleteRabbitPrefix(t testing.TB, url, prefix string) {
	t.Helper()
	switch err := RemoveRabbitPrefix(url, prefix); {
	case errors.Is(err, errRabbitmqctl):
		t.Fatalf("cleanup of %s: %v", prefix, err)
	case err != nil:
		t.Logf("cleanup of %s: %v", prefix, err)
	}
}

// errRabbitmqctl marks a failed rabbitmqctl: the tool is missing or
// broken, which fails a test rather than leaving a note.
var errRabbitmqctl = errors.New("rabbitmqctl failed")

// RemoveRabbitPrefix is DeleteRabbitPrefix for code that has no test, such
// as a TestMain: it returns what went wrong instead of logging it.
func RemoveRabbitPrefix(url, prefix string) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	for _, kind := range []string{"list_queues", "list_exchanges"} {
		out, err := exec.Command(envOr("DELAYBRIDGE_RABBITMQCTL", "rabbitmqctl"), kind, "name", "--quiet", "--no-table-headers").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s: %v\n%s", errRabbitmqctl, kind, err, out)
		}
		for _, name := range strings.Fields(string(out)) {
			if !strings.HasPrefix(name, prefix+".") {
				continue
			}
			ch, err := conn.Channel()
			if err != nil {
				return err
			}
			if kind == "list_queues" {
				_, _ = ch.QueueDelete(name, false, false, false)
			} else {
				_ = ch.ExchangeDelete(name, false, false)
			}
			_ = ch.Close()
		}
	}
	return nil
}

// SkipIfShort skips a test that needs the services or disturbs them when
// go test runs with -short, except under CI=true, where nothing that needs a
// service may skip: there the test runs (and fails if a service is down).
func SkipIfShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip(why + "; skipped under -short")
	}
}

// EnvInt returns the positive integer in the environment variable name, or
// def when it is unset, not a number or not positive: a benchmark's knob.
func EnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// Collector checks the test OpenTelemetry Collector (scripts/services.sh)
// accepts connections and returns its OTLP/HTTP endpoint and the log its
// debug exporter writes every span to.
func Collector(t testing.TB) (endpoint, logFile string) {
	t.Helper()
	endpoint = envOr("DELAYBRIDGE_TEST_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	logFile = os.Getenv("DELAYBRIDGE_TEST_OTELCOL_LOG")
	u, err := url.Parse(endpoint)
	if err == nil {
		var conn net.Conn
		if conn, err = net.DialTimeout("tcp", u.Host, reachTimeout); err == nil {
			_ = conn.Close()
		}
	}
	if err == nil && logFile == "" {
		err = fmt.Errorf("DELAYBRIDGE_TEST_OTELCOL_LOG is not set")
	}
	if err != nil {
		Unreachable(t, "the OpenTelemetry Collector", endpoint, err)
	}
	return endpoint, logFile
}
