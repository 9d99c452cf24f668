package integration

// The fault suite runs the consumer of each pipeline in a process of its
// own, so it can be killed with SIGKILL mid-handler: the test binary
// started again with faultRoleEnv set runs that role instead of the tests.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

const (
	faultRoleEnv   = "DELAYBRIDGE_FAULT_ROLE"
	faultConfigEnv = "DELAYBRIDGE_FAULT_CONFIG"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(faultRoleEnv); role != "" {
		os.Exit(runFaultRole(role))
	}
	os.Exit(m.Run())
}

// pipelineConfig is what a role process needs to reach its pipeline, the
// database and the broker through the test's proxies.
type pipelineConfig struct {
	Broker  string // "rabbit" or "rocket"
	DSN     string
	AMQPURL string
	Prefix  string // RabbitMQ topology prefix
	Namesrv string
	Group   string // RocketMQ consumer group prefix
	Topic   string
}

// The delay settings every process of a pipeline shares: short hops, so
// tasks of a few seconds hop at least once.
const (
	faultRabbitUnit  = 100 * time.Millisecond
	faultRabbitDepth = 6 // one hop covers 6.3s
	faultRocketHop   = 2 * time.Second
	faultRocketPrec  = 100 * time.Millisecond
)

func (c pipelineConfig) open(ctx context.Context) (broker.Publisher, broker.Subscriber, func(), error) {
	switch c.Broker {
	case "rabbit":
		cfg := rabbit.Config{URL: c.AMQPURL, Prefix: c.Prefix, Unit: faultRabbitUnit, Depth: faultRabbitDepth, ConnectionName: c.Prefix + "-consumer"}
		pub, err := rabbit.NewPublisher(ctx, cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		sub, err := rabbit.NewSubscriber(cfg)
		if err != nil {
			_ = pub.Close()
			return nil, nil, nil, err
		}
		return pub, sub, func() { _ = sub.Close(); _ = pub.Close() }, nil
	case "rocket":
		cfg := rocket.Config{NameServers: strings.Split(c.Namesrv, ","), Limits: rocket.TimerLimits(faultRocketHop, faultRocketPrec), GroupPrefix: c.Group}
		pub, err := rocket.NewPublisher(ctx, cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		sub, err := rocket.NewSubscriber(cfg)
		if err != nil {
			_ = pub.Close()
			return nil, nil, nil, err
		}
		return pub, sub, func() { _ = sub.Close(); _ = pub.Close() }, nil
	}
	return nil, nil, nil, fmt.Errorf("unknown broker %q", c.Broker)
}

func runFaultRole(role string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var cfg pipelineConfig
	if err := json.Unmarshal([]byte(os.Getenv(faultConfigEnv)), &cfg); err != nil {
		log.Error("fault role: bad config", "err", err)
		return 2
	}
	if role != "consumer" {
		log.Error("fault role: unknown", "role", role)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := faultConsumer(ctx, cfg, log); err != nil {
		log.Error("fault consumer", "err", err)
		return 1
	}
	return 0
}

// faultConsumer runs the order-timeout handler: outbox.Handle, an effect
// row per run of the business code (so a second effect of one task shows),
// and the conditional cancel. 2-12ms of sleep inside the transaction make a
// SIGKILL land mid-handler often.
func faultConsumer(ctx context.Context, cfg pipelineConfig, log *slog.Logger) error {
	db, err := sql.Open("mysql", cfg.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(40)
	db.SetConnMaxLifetime(time.Minute)

	// Through outbox.NewConsumer, as users run it: tasks due together share
	// a transaction, each in its own savepoint.
	fn := func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO fault_effect (task_key, handled_ms) VALUES (?, ?)", m.Key, time.Now().UnixMilli()); err != nil {
			return err
		}
		time.Sleep(time.Duration(2+rand.IntN(10)) * time.Millisecond)
		_, err := tx.ExecContext(ctx, "UPDATE fault_order SET status = 'CANCELLED' WHERE id = ? AND status = 'UNPAID'", m.Key)
		return err
	}
	start := func() (*broker.Consumer, func(), error) {
		pub, sub, closeAll, err := cfg.open(ctx)
		if err != nil {
			return nil, nil, err
		}
		c, err := outbox.NewConsumer(db, sub, pub, fn, broker.ConsumerConfig{
			Concurrency:    16,
			HandlerTimeout: 20 * time.Second,
			DeadLetter:     outbox.DeadLetter(db, nil),
			Logger:         log,
		})
		if err == nil {
			err = c.Start(ctx, cfg.Topic)
		}
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		return c, closeAll, nil
	}
	// The broker may be coming back from a fault of its own: retry for a
	// while, as a supervisor restarting the process would.
	var (
		c        *broker.Consumer
		closeAll func()
	)
	if !testutil.Eventually(3*time.Minute, time.Second, func() bool {
		if c, closeAll, err = start(); err == nil || ctx.Err() != nil {
			return true
		}
		log.Warn("fault consumer: not started, retrying", "err", err)
		return false
	}) || err != nil {
		return fmt.Errorf("consume %s on %s: %w", cfg.Topic, cfg.Broker, err)
	}
	defer closeAll()
	fmt.Fprintln(os.Stderr, "fault consumer: consuming", cfg.Topic)
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return c.Close(cctx)
}
