package integration

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Moving a running deployment from delayed-exchange mode to the ladder
// (docs/brokers.md): the relay and the consumers stop while the plugin
// holds messages not yet due, start again in ladder mode under the same
// prefix, and every task, held at the switch or scheduled after it, runs
// once and never early. No scanner runs: what the plugin held reaches the
// ladder's consumers through the topic queue's binding to the delayed
// exchange, which the switch must leave in place.
func TestRabbitModeSwitch_DelayedExchangeToLadderLosesNothing(t *testing.T) {
	testenv.DelayedPlugin(t)
	f := newFlow(t)
	ladder := rabbitConfig(t)
	delayed := ladder
	delayed.Mode = rabbit.ModeDelayedExchange

	// Before: the whole pipeline in delayed-exchange mode.
	const held, after = 60, 40
	start := time.Now()
	for i := range held {
		f.order(t, fmt.Sprintf("held-%d", i), start.Add(4*time.Second+time.Duration(i)*3*time.Second/held))
	}
	pubD, subD := rabbitClients(t, delayed)
	consumerD, err := broker.NewConsumer(subD, pubD, f.handler(t), broker.ConsumerConfig{Logger: quiet(), DeadLetter: outbox.DeadLetter(f.db, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if err := consumerD.Start(f.ctx, f.topic); err != nil {
		t.Fatal(err)
	}
	relayD, err := outbox.NewRelay(f.db, pubD, outbox.RelayConfig{Logger: quiet(), IdleMax: 50 * time.Millisecond, Lookahead: -1})
	if err != nil {
		t.Fatal(err)
	}
	for f.count(t, "SELECT COUNT(*) FROM delay_task WHERE state = 'pending'") > 0 {
		if _, err := relayD.Once(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The switch: every delayed-exchange process stops while the plugin
	// holds every task (the first is due 4 s after it was scheduled).
	ctx, cancel := context.WithTimeout(f.ctx, 15*time.Second)
	err = consumerD.Close(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if done := f.count(t, "SELECT COUNT(*) FROM delay_task WHERE state = 'done'"); done != 0 || time.Now().After(start.Add(4*time.Second)) {
		t.Fatalf("%d tasks done at the switch, %v after the first was scheduled: the test must switch while the plugin holds them all", done, time.Since(start))
	}

	// After: the ladder, same prefix, and new orders.
	pubL, subL := rabbitClients(t, ladder)
	f.consume(t, pubL, subL)
	f.relay(t, pubL)
	for i := range after {
		f.order(t, fmt.Sprintf("after-%d", i), time.Now().Add(time.Second+time.Duration(i)*6*time.Second/after))
	}
	f.waitDone(t, held+after, 60*time.Second)
	f.checkOnce(t, held+after)
	// Never early by the database's clock either: each task turned done
	// at or after its due time.
	if early := f.count(t, "SELECT COUNT(*) FROM delay_task WHERE updated_ms < due_ms"); early != 0 {
		t.Fatalf("%d tasks marked done before their due time", early)
	}
}

// A Client in delayed-exchange mode that relays, scans and consumes says
// once, when it starts, that the plugin is retired, and runs its task.
func TestRabbitModeSwitch_AClientInPluginModeWarnsOnce(t *testing.T) {
	testenv.DelayedPlugin(t)
	f := newFlow(t)
	cfg := rabbitConfig(t)
	cfg.Mode = rabbit.ModeDelayedExchange
	logs := &records{}
	c, err := delaybridge.NewClient(f.db, delaybridge.Config{
		Broker:  rabbit.New(cfg),
		Relay:   &delaybridge.RelayConfig{IdleMax: 50 * time.Millisecond},
		Scanner: &delaybridge.ScannerConfig{},
		Logger:  slog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	if err := c.Handle(f.topic, func(context.Context, *sql.Tx, *delaybridge.Message) error { handled.Add(1); return nil }); err != nil {
		t.Fatal(err)
	}
	f.order(t, "k", time.Now().Add(time.Second))
	if err := c.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the task handled", func() bool { return handled.Load() == 1 })
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := logs.count("archived upstream"); n != 1 {
		t.Fatalf("%d retirement warnings, want 1: %q", n, logs.messages())
	}
}

// records is a slog handler that keeps every message at warn and above.
type records struct {
	mu   sync.Mutex
	list []string
}

func (r *records) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, rec.Message)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list)
}

func (r *records) count(substr string) int {
	n := 0
	for _, m := range r.messages() {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}
