package services_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/services"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// relays counts the live relay presence records.
func relays(t *testing.T, ctx context.Context, q outbox.Querier) int {
	t.Helper()
	live, err := outbox.LivePresences(ctx, q, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range live {
		if p.Role == outbox.RoleRelay {
			n++
		}
	}
	return n
}

// A group records the relay's presence when built, runs its parts until
// Stop, and withdraws the record; a part that cannot be built records
// nothing.
func TestGroup_RecordsARelayRunsItsPartsAndWithdraws(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	db, _ := testenv.ScratchDB(t)
	ctx := context.Background()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	pub := memory.New(memory.Config{Limits: broker.Limits{MaxHop: time.Hour}})
	topo := broker.Topology{Broker: "memory"}

	bad := outbox.RelayConfig{Probe: time.Second, ProbeMax: time.Millisecond}
	if _, err := services.New(ctx, db, pub, services.Config{Relay: &bad, Presence: &topo}); err == nil || !strings.Contains(err.Error(), "ProbeMax") {
		t.Fatalf("New with a relay it cannot build = %v, want the relay's error", err)
	}
	if n := relays(t, ctx, db); n != 0 {
		t.Fatalf("a group that failed to build left %d relay records", n)
	}

	g, err := services.New(ctx, db, pub, services.Config{Relay: &outbox.RelayConfig{}, Scanner: &scanner.Config{},
		Cleaner: &outbox.CleanerConfig{}, Stats: &outbox.StatsRefresherConfig{}, Presence: &topo})
	if err != nil {
		t.Fatal(err)
	}
	if g.Relay() == nil {
		t.Fatal("Relay() = nil for a group with a relay")
	}
	if n := relays(t, ctx, db); n != 1 {
		t.Fatalf("after New: %d relay records, want 1", n)
	}
	g.Start()
	g.Stop()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := g.Wait(wctx); err != nil {
		t.Fatalf("Wait after Stop = %v, want every part ended", err)
	}
	if err := g.Withdraw(ctx); err != nil {
		t.Fatal(err)
	}
	if n := relays(t, ctx, db); n != 0 {
		t.Fatalf("after Withdraw: %d relay records, want 0", n)
	}
}

// Wait bounds the wait for a part that ignores its context by Wait's
// own context.
func TestGroup_WaitIsBoundedByItsContext(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	db, _ := testenv.ScratchDB(t)
	ctx := context.Background()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	sc := scanner.Config{Business: &scanner.Business{Name: "stubborn", Every: 10 * time.Millisecond,
		Query: func(context.Context, *sql.DB, int) ([]string, error) {
			select {
			case <-entered:
			default:
				close(entered)
			}
			<-release // ignores ctx
			return nil, nil
		},
		Handle: func(context.Context, string) error { return nil }}}
	g, err := services.New(ctx, db, memory.New(memory.Config{}), services.Config{Scanner: &sc})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Wait(ctx); err != nil {
		t.Fatalf("Wait before Start = %v, want nil", err)
	}
	g.Start()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the business query never ran")
	}
	g.Stop()
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := g.Wait(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with a part stuck = %v, want context.DeadlineExceeded", err)
	}
}
