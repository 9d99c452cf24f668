package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// The program against the real services (scripts/services.sh env), once
// per broker, in a database of its own. It reads its settings as a user's
// run would; the test only adds a scratch database, small queues of its
// own and a longer timeout.
//
// The program creates every order before it pays the first, and that
// payment must land before the first order's cancel time, so the timeout
// has to outlast creating all 40 orders on a slow machine: 10 s does, and
// a run still takes little more than the timeout per broker.
func TestOrderTimeout_HoldsItsInvariantsOnBothBrokers(t *testing.T) {
	dsn := scratchDatabase(t)
	for _, b := range []struct {
		name string
		args func(t *testing.T) []string
	}{
		// The RabbitMQ queues are the test's own, so a message an earlier
		// run left behind cannot reach this one, and they go at cleanup.
		{"rabbit", func(t *testing.T) []string {
			url, prefix := os.Getenv("DELAYBRIDGE_AMQP_URL"), testenv.Name("ordertimeout")
			t.Cleanup(func() { testenv.DeleteRabbitPrefix(t, url, prefix) })
			return []string{"--broker", "rabbit", "--rabbit-prefix", prefix, "--rabbit-depth", "8"}
		}},
		// The RocketMQ group stays fixed: the program's topic is, and a new
		// group would start at the first message the broker still has on
		// it, every earlier run's included. An old message is harmless
		// either way, since its task is not in this run's database.
		{"rocket", func(*testing.T) []string {
			return []string{"--broker", "rocket", "--rocketmq-group-prefix", "ordertimeout-test"}
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			if b.name == "rabbit" && os.Getenv("DELAYBRIDGE_AMQP_URL") == "" {
				unavailable(t, "DELAYBRIDGE_AMQP_URL is not set")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
			defer cancel()
			var out, errOut bytes.Buffer
			args := append([]string{"--mysql-dsn", dsn, "--orders", "40", "--timeout", "10s"}, b.args(t)...)
			if err := run(ctx, args, &out, &errOut); err != nil {
				t.Fatalf("ordertimeout %v: %v\n%s%s", args, err, out.String(), errOut.String())
			}
			for _, want := range []string{"orders 40:", "paid and cancelled: 0; unpaid past the cancel time: 0; cancelled early: 0; stock consistent: true",
				"shown UNPAID after the cancel time 0 times", "every invariant holds"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func TestOrderTimeout_RefusesBadFlagsBeforeConnecting(t *testing.T) {
	for _, args := range [][]string{
		{"--orders", "1"},
		{"--timeout", "0s"},
		{"--no-such-flag"},
		{"--broker", "kafka", "--mysql-dsn", "u:p@tcp(127.0.0.1:1)/x"},
	} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, &out, &errOut); err == nil {
			t.Errorf("ordertimeout %v succeeded", args)
		}
		if strings.Contains(out.String(), "orders on") {
			t.Errorf("ordertimeout %v started:\n%s", args, out.String())
		}
	}
}

// scratchDatabase creates a database of the test's own next to
// DELAYBRIDGE_MYSQL_DSN's, returns its DSN and drops it at cleanup.
func scratchDatabase(t *testing.T) string {
	t.Helper()
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("needs the services; skipped under -short")
	}
	dsn := os.Getenv("DELAYBRIDGE_MYSQL_DSN")
	if dsn == "" {
		unavailable(t, "DELAYBRIDGE_MYSQL_DSN is not set (eval \"$(scripts/services.sh env)\")")
	}
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		unavailable(t, fmt.Sprintf("MariaDB unreachable: %v", err))
	}
	name := fmt.Sprintf("delaybridge_ot%d", rand.Uint64()%1_000_000_000_000)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name) })
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = name
	return cfg.FormatDSN()
}

// unavailable fails under CI=true, where every service must be up, and
// skips elsewhere.
func unavailable(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}
