package delaybridge_test

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestMain gives the examples, which read their settings from the
// environment as a service would, a scratch database of their own and the
// local RabbitMQ (scripts/services.sh). Without the services the examples
// fail under CI=true, and elsewhere (and under -short) only the tests run,
// as tests that need a service skip there.
func TestMain(m *testing.M) {
	flag.Parse()
	cleanup, err := exampleServices()
	switch {
	case err == nil:
		code := m.Run()
		cleanup()
		os.Exit(code)
	case os.Getenv("CI") == "true":
		fmt.Fprintf(os.Stderr, "delaybridge examples: %v (CI=true: a missing service fails; run scripts/services.sh up)\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "delaybridge examples not run: %v\n", err)
	if run := flag.Lookup("test.run"); run.Value.String() == "" {
		_ = run.Value.Set("^Test")
	}
	os.Exit(m.Run())
}

// exampleServices points DELAYBRIDGE_MYSQL_DSN at a new scratch database
// and the broker settings at the local RabbitMQ with a small ladder under
// a prefix of its own. cleanup drops both.
func exampleServices() (cleanup func(), err error) {
	if testing.Short() && os.Getenv("CI") != "true" {
		return nil, fmt.Errorf("-short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin, err := sql.Open("mysql", testenv.MySQLDSN())
	if err != nil {
		return nil, fmt.Errorf("MariaDB: %w", err)
	}
	if err := admin.PingContext(ctx); err != nil {
		admin.Close()
		return nil, fmt.Errorf("MariaDB unreachable: %w", err)
	}
	u, err := url.Parse(testenv.AMQPURL())
	if err != nil {
		admin.Close()
		return nil, fmt.Errorf("RabbitMQ URL: %w", err)
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", u.Host)
	if err != nil {
		admin.Close()
		return nil, fmt.Errorf("RabbitMQ unreachable: %w", err)
	}
	c.Close()
	name := fmt.Sprintf("delaybridge_ex%d", rand.Uint64()%1_000_000_000_000)
	prefix := testenv.Name("example")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		admin.Close()
		return nil, fmt.Errorf("create scratch database: %w", err)
	}
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN())
	if err != nil {
		admin.Close()
		return nil, err
	}
	cfg.DBName = name
	for k, v := range map[string]string{
		"DELAYBRIDGE_MYSQL_DSN":     cfg.FormatDSN(),
		"DELAYBRIDGE_BROKER":        "rabbit",
		"DELAYBRIDGE_AMQP_URL":      testenv.AMQPURL(),
		"DELAYBRIDGE_RABBIT_PREFIX": prefix,
		"DELAYBRIDGE_RABBIT_DEPTH":  "8",
	} {
		os.Setenv(k, v)
	}
	return func() {
		_, _ = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name)
		admin.Close()
		if err := testenv.RemoveRabbitPrefix(testenv.AMQPURL(), prefix); err != nil {
			fmt.Fprintf(os.Stderr, "delaybridge examples: cleanup of RabbitMQ prefix %s: %v\n", prefix, err)
		}
	}, nil
}
