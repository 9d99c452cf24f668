// Package services runs the background services of a process that
// relays: the relay, the scanner, the cleaner, the counts refresher and
// the relay's presence record. The Client and delaybridge run both start
// them here, so the two cannot drift apart.
package services

import (
	"context"
	"database/sql"
	"log/slog"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
)

// Config names the parts to run. A nil part is not run.
type Config struct {
	// Relay publishes pending tasks.
	Relay *outbox.RelayConfig
	// Scanner publishes again what a broker lost.
	Scanner *scanner.Config
	// Cleaner deletes finished tasks past their retention.
	Cleaner *outbox.CleanerConfig
	// Stats recounts tasks by state and topic for status and /metrics.
	Stats *outbox.StatsRefresherConfig
	// Presence, when not nil, is the topology the group records as a live
	// relay (outbox.RoleRelay) until Withdraw, so status sees a relay.
	Presence *broker.Topology
	// PresenceConfig tunes that record.
	PresenceConfig outbox.PresenceConfig
	// Logger, when not nil, logs a part that ends with an error before
	// Stop. Nil logs nothing.
	Logger *slog.Logger
	// Tracing, when on, makes a span of each task the relay publishes
	// and each the scanner publishes again.
	Tracing broker.Tracing
}

// Group is the running parts of one Config. Build it with New, then
// Start; Stop, Wait and Withdraw end it.
type Group struct {
	relay    *outbox.Relay
	runs     []func(context.Context) error
	presence *outbox.Announcement
	log      *slog.Logger

	stop context.CancelFunc
	done chan struct{}
}

// New builds the parts cfg names on db and pub, then records the relay's
// presence. A part that cannot be built is an error and nothing is
// recorded. Nothing runs until Start.
func New(ctx context.Context, db *sql.DB, pub broker.Publisher, cfg Config) (*Group, error) {
	g := &Group{log: cfg.Logger}
	if cfg.Relay != nil {
		relay, err := outbox.NewRelay(db, broker.TracePublisher(pub, cfg.Tracing, "send"), *cfg.Relay)
		if err != nil {
			return nil, err
		}
		g.relay = relay
		g.runs = append(g.runs, relay.Run)
	}
	if cfg.Scanner != nil {
		s, err := scanner.New(db, broker.TracePublisher(pub, cfg.Tracing, "rescue"), *cfg.Scanner)
		if err != nil {
			return nil, err
		}
		g.runs = append(g.runs, s.Run)
	}
	if cfg.Cleaner != nil {
		g.runs = append(g.runs, outbox.NewCleaner(db, *cfg.Cleaner).Run)
	}
	if cfg.Stats != nil {
		g.runs = append(g.runs, outbox.NewStatsRefresher(db, *cfg.Stats).Run)
	}
	if cfg.Presence != nil {
		p, err := outbox.Announce(ctx, db, outbox.Presence{Role: outbox.RoleRelay, Topology: *cfg.Presence}, cfg.PresenceConfig)
		if err != nil {
			return nil, err
		}
		g.presence = p
	}
	return g, nil
}

// Relay returns the relay, nil when the Config has none.
func (g *Group) Relay() *outbox.Relay { return g.relay }

// Start runs every part in a goroutine of its own until Stop. What it
// starts does not end with the context New was given.
func (g *Group) Start() {
	if g.stop != nil {
		return
	}
	work, stop := context.WithCancel(context.Background())
	g.stop, g.done = stop, make(chan struct{})
	var wg sync.WaitGroup
	for _, run := range g.runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(work); err != nil && work.Err() == nil && g.log != nil {
				g.log.Error("delaybridge: background component stopped", "err", err)
			}
		}()
	}
	go func() { wg.Wait(); close(g.done) }()
}

// Stop tells every part to end: the relay after its batch in flight, the
// scanner after its pass, the cleaner after its batch. It does not wait.
func (g *Group) Stop() {
	if g.stop != nil {
		g.stop()
	}
}

// Wait waits for the parts Stop ended, until ctx is done: nil when all
// have ended (or none was started), ctx's error otherwise.
func (g *Group) Wait(ctx context.Context) error {
	if g.done == nil {
		return nil
	}
	select {
	case <-g.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// withdrawTimeout bounds Withdraw: a database gone at shutdown must not
// hold the exit, and the record expires anyway.
const withdrawTimeout = 5 * time.Second

// Withdraw deletes the relay's presence record, within withdrawTimeout
// whatever becomes of ctx. Without a record it does nothing.
func (g *Group) Withdraw(ctx context.Context) error {
	if g.presence == nil {
		return nil
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
	defer cancel()
	return g.presence.Close(wctx)
}
