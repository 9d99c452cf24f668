package delaybridge_test

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// BenchmarkIdle runs, with nothing due, a Client with default settings
// that consumes one topic and also runs the relay and the scanner in this
// process (what `delaybridge run` and one consumer do between them), on
// the local RabbitMQ, or RocketMQ with DELAYBRIDGE_BENCH_IDLE_BROKER=rocket.
// After a warm-up it measures the CPU this process uses over 30 s and
// reports it as a percentage of one core (cpu_%).
func BenchmarkIdle(b *testing.B) {
	db, _ := testenv.ScratchDB(b)
	db.SetMaxIdleConns(delaybridge.DefaultMaxIdleConns) // the pool Config.OpenDB gives
	ctx := context.Background()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		b.Fatal(err)
	}
	cfg := delaybridge.Config{Relay: &delaybridge.RelayConfig{}, Scanner: &scanner.Config{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if os.Getenv("DELAYBRIDGE_BENCH_IDLE_BROKER") == "rocket" {
		cfg.Broker = rocket.New(rocket.Config{NameServers: []string{testenv.RocketMQ(b)}, GroupPrefix: testenv.Name("idle"),
			CreateTopics: true, BrokerAddr: testenv.RocketBrokerAddr()})
	} else {
		url, prefix := testenv.AMQP(b), testenv.Name("idle")
		b.Cleanup(func() { testenv.DeleteRabbitPrefix(b, url, prefix) })
		cfg.Broker = rabbit.New(rabbit.Config{URL: url, Prefix: prefix})
	}
	c, err := delaybridge.NewClient(db, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Handle("idle", func(context.Context, *sql.Tx, *broker.Message) error { return nil }); err != nil {
		b.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_ = c.Stop(sctx)
	}()
	time.Sleep(5 * time.Second)
	for b.Loop() {
		before := cpu(b)
		start := time.Now()
		time.Sleep(30 * time.Second)
		b.ReportMetric(100*float64(cpu(b)-before)/float64(time.Since(start)), "cpu_%")
	}
}

// cpu is the user and system time this process used so far.
func cpu(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
