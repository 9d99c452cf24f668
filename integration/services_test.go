package integration

// Shared helpers for tests against the local services of scripts/services.sh.
// The settings come from the environment (`scripts/services.sh env` prints
// them); unset, they default to exactly what that script sets up.

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	defaultMySQLDSN        = "delaybridge:delaybridge@tcp(127.0.0.1:3306)/delaybridge?parseTime=true&multiStatements=true"
	defaultAMQPURL         = "amqp://delaybridge:delaybridge@127.0.0.1:5672/"
	defaultRocketMQNamesrv = "127.0.0.1:9876"

	reachTimeout = 5 * time.Second
)

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func mysqlDSN() string        { return envOr("DELAYBRIDGE_MYSQL_DSN", defaultMySQLDSN) }
func amqpURL() string         { return envOr("DELAYBRIDGE_AMQP_URL", defaultAMQPURL) }
func rocketMQNamesrv() string { return envOr("DELAYBRIDGE_ROCKETMQ_NAMESRV", defaultRocketMQNamesrv) }

// unreachable fails the test under CI=true, where every service must be up,
// and skips it elsewhere, so `go test ./...` without services stays green.
func unreachable(t testing.TB, service, where string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s unreachable at %s: %v (run scripts/services.sh up)", service, where, err)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// requireMySQL returns a pool on the delaybridge database, closed at cleanup.
func requireMySQL(t testing.TB) *sql.DB {
	t.Helper()
	dsn := mysqlDSN()
	where := "DELAYBRIDGE_MYSQL_DSN"
	if cfg, err := mysql.ParseDSN(dsn); err == nil {
		where = fmt.Sprintf("%s@%s/%s", cfg.User, cfg.Addr, cfg.DBName)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		unreachable(t, "MariaDB", where, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), reachTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		unreachable(t, "MariaDB", where, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// requireAMQP returns a connection to RabbitMQ, closed at cleanup.
func requireAMQP(t testing.TB) *amqp.Connection {
	t.Helper()
	raw := amqpURL()
	where := "DELAYBRIDGE_AMQP_URL"
	if u, err := url.Parse(raw); err == nil {
		where = u.Redacted()
	}
	conn, err := amqp.DialConfig(raw, amqp.Config{Dial: amqp.DefaultDial(reachTimeout)})
	if err != nil {
		unreachable(t, "RabbitMQ", where, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

var quietRocketMQ sync.Once

// requireRocketMQ returns the name server address once it accepts connections.
// It also turns the RocketMQ client's logging down to errors.
func requireRocketMQ(t testing.TB) string {
	t.Helper()
	quietRocketMQ.Do(func() { rlog.SetLogLevel("error") })
	namesrv := rocketMQNamesrv()
	conn, err := net.DialTimeout("tcp", namesrv, reachTimeout)
	if err != nil {
		unreachable(t, "RocketMQ name server", namesrv, err)
	}
	_ = conn.Close()
	return namesrv
}

// uniqueName returns prefix plus a suffix unique to this run, made of
// [A-Za-z0-9_], so it is a legal table, queue and topic name alike.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), time.Now().UnixNano())
}
