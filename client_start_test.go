package delaybridge_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"math"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// rabbitNames lists the queues and exchanges on the broker whose names
// start with prefix and a dot.
func rabbitNames(t *testing.T, prefix string) []string {
	t.Helper()
	ctl := os.Getenv("DELAYBRIDGE_RABBITMQCTL")
	if ctl == "" {
		ctl = "rabbitmqctl"
	}
	var names []string
	for _, kind := range []string{"list_queues", "list_exchanges"} {
		out, err := exec.Command(ctl, kind, "name", "--quiet", "--no-table-headers").CombinedOutput()
		if err != nil {
			t.Fatalf("rabbitmqctl %s: %v\n%s", kind, err, out)
		}
		for _, n := range strings.Fields(string(out)) {
			if strings.HasPrefix(n, prefix+".") {
				names = append(names, n)
			}
		}
	}
	return names
}

// A consumer refused for its prefix is refused before it declares anything:
// with a live relay of another prefix, Start fails and the broker holds no
// queue or exchange of the consumer's prefix.
func TestClient_StartRefusedForItsPrefixDeclaresNothing(t *testing.T) {
	b := setup(t)
	relayCfg := b.rabbit
	relayCfg.Prefix = testenv.Name("relay")
	topo, err := rabbit.New(relayCfg).Topology()
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.Announce(b.ctx, b.db, outbox.Presence{Role: outbox.RoleRelay, Topology: topo}, outbox.PresenceConfig{Logger: b.cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close(b.ctx) //nolint:errcheck
	b.cfg.Relay = nil
	c, err := delaybridge.NewClient(b.db, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Handle("shop-cancel", func(context.Context, *sql.Tx, *broker.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); !errors.Is(err, outbox.ErrTopologyMismatch) {
		t.Fatalf("Start = %v, want ErrTopologyMismatch", err)
	}
	if names := rabbitNames(t, b.rabbit.Prefix); len(names) > 0 {
		t.Fatalf("the refused consumer left %d queues and exchanges behind: %v", len(names), names)
	}
	var live int
	if err := b.db.QueryRow("SELECT COUNT(*) FROM delaybridge_presence WHERE role = 'consumer'").Scan(&live); err != nil {
		t.Fatal(err)
	}
	if live != 0 {
		t.Fatalf("the refused consumer left %d presence records", live)
	}
}

// Start waits out a broker that does not answer for a moment, saying so in
// the log, and logs one line once it runs.
func TestClient_StartRidesOutABrokerHiccupAndLogsThatItStarted(t *testing.T) {
	b := setup(t)
	u, err := url.Parse(b.rabbit.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	rc := b.rabbit
	rc.URL = u.String()
	b.cfg = b.on(rc)
	b.cfg.Relay = nil
	var log testenv.SyncBuffer
	b.cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	c, err := delaybridge.NewClient(b.db, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Handle("hiccup", func(context.Context, *sql.Tx, *broker.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	time.AfterFunc(1500*time.Millisecond, proxy.Restore)
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start across a 1.5 s broker hiccup = %v, want it to wait and start", err)
	}
	defer c.Stop(context.Background()) //nolint:errcheck
	out := log.String()
	if !strings.Contains(out, "trying again") {
		t.Errorf("no retry logged:\n%s", out)
	}
	if n := strings.Count(out, "client started"); n != 1 || !strings.Contains(out, "prefix="+b.rabbit.Prefix) || !strings.Contains(out, "hiccup") {
		t.Errorf("want one start line naming the prefix and the topics, got %d:\n%s", n, out)
	}
}

// Handle refuses options it could not run, before Start.
func TestClient_HandleRefusesBadOptions(t *testing.T) {
	c, err := delaybridge.NewClient(&sql.DB{}, delaybridge.Config{Broker: rabbit.New(rabbit.Config{URL: "amqp://localhost:5672/"})})
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, *sql.Tx, *broker.Message) error { return nil }
	for name, o := range map[string]delaybridge.HandleOption{
		"group 0":         delaybridge.GroupSize(0),
		"attempts 0":      delaybridge.MaxAttempts(0),
		"timeout 0":       delaybridge.HandlerTimeout(0),
		"rate 0":          delaybridge.RateLimit(0),
		"rate negative":   delaybridge.RateLimit(-5),
		"rate infinite":   delaybridge.RateLimit(math.Inf(1)),
		"rate NaN":        delaybridge.RateLimit(math.NaN()),
		"concurrency 0":   delaybridge.MaxConcurrency(0),
		"shrinking retry": delaybridge.RetryBackoff(broker.Backoff{Multiplier: 0.5}),
		"zero option":     {},
	} {
		if err := c.Handle("t-"+strings.ReplaceAll(name, " ", "-"), noop, o); err == nil {
			t.Errorf("%s: Handle accepted it", name)
		}
	}
	if err := c.Handle("calls-out", noop, delaybridge.GroupSize(1), delaybridge.MaxAttempts(3), delaybridge.HandlerTimeout(5*time.Second),
		delaybridge.RateLimit(500), delaybridge.MaxConcurrency(4)); err != nil {
		t.Errorf("sound options refused: %v", err)
	}
}

// A client that relays without a scanner says so when it starts: the
// tasks of a relay killed mid-batch wait for a scanner. With one, it says
// nothing of it.
func TestClient_ARelayWithoutAScannerSaysSoAtStart(t *testing.T) {
	for _, withScanner := range []bool{false, true} {
		b := setup(t)
		if b.cfg.Relay == nil {
			b.cfg.Relay = &delaybridge.RelayConfig{}
		}
		b.cfg.Scanner = nil
		if withScanner {
			b.cfg.Scanner = &delaybridge.ScannerConfig{}
		}
		var log testenv.SyncBuffer
		b.cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
		c, err := delaybridge.NewClient(b.db, b.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if warned := strings.Contains(log.String(), "relays without a scanner"); warned == withScanner {
			t.Errorf("scanner %v: warned %v, want %v:\n%s", withScanner, warned, !withScanner, log.String())
		}
	}
}
