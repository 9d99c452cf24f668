package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

func rabbitTopology(prefix string) broker.Topology {
	return broker.Topology{Broker: "rabbit", Settings: map[string]string{"prefix": prefix, "mode": "ladder", "unit": "100ms", "depth": "26"}}
}

func announce(t *testing.T, b *bundle, p outbox.Presence, cfg outbox.PresenceConfig) *outbox.Announcement {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	a, err := outbox.Announce(b.ctx, b.db, p, cfg)
	if err != nil {
		t.Fatalf("Announce(%s %s): %v", p.Role, p.Topology, err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	return a
}

func TestAnnounce_ConsumerWithAnotherPrefixThanTheRelayFailsNamingBoth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	announce(t, b, outbox.Presence{Instance: "relay-1", Role: outbox.RoleRelay, Topology: rabbitTopology("delaybridge")}, outbox.PresenceConfig{})
	_, err := outbox.Announce(b.ctx, b.db, outbox.Presence{Instance: "shop-1", Role: outbox.RoleConsumer,
		Topology: rabbitTopology("shop"), Topics: []string{"order-cancel"}}, outbox.PresenceConfig{Logger: quiet()})
	if !errors.Is(err, outbox.ErrTopologyMismatch) {
		t.Fatalf("Announce = %v, want ErrTopologyMismatch", err)
	}
	for _, want := range []string{`prefix: "shop" here, "delaybridge" there`, "relay relay-1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if n := b.countPresences(t); n != 1 {
		t.Fatalf("%d presences recorded, want only the relay's", n)
	}
	// The same settings start, and both count as live.
	announce(t, b, outbox.Presence{Instance: "shop-2", Role: outbox.RoleConsumer, Topology: rabbitTopology("delaybridge"), Topics: []string{"order-cancel"}}, outbox.PresenceConfig{})
	live, err := outbox.LivePresences(b.ctx, b.db, time.Minute)
	if err != nil || len(live) != 2 || live[1].Instance != "shop-2" || live[1].Topics[0] != "order-cancel" || live[1].Topology.Settings["prefix"] != "delaybridge" {
		t.Fatalf("live presences %+v, %v", live, err)
	}
}

func TestAnnounce_RelayWarnsOfAConsumerThatStartsLaterWithAnotherOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs testenv.SyncBuffer
	announce(t, b, outbox.Presence{Instance: "relay-1", Role: outbox.RoleRelay, Topology: rabbitTopology("delaybridge")},
		outbox.PresenceConfig{Heartbeat: 20 * time.Millisecond, Expiry: time.Minute, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	announce(t, b, outbox.Presence{Instance: "shop-1", Role: outbox.RoleConsumer, Topology: rabbitTopology("shop"), Topics: []string{"order-cancel"}},
		outbox.PresenceConfig{WarnOnly: true})
	if !testutil.Eventually(5*time.Second, 10*time.Millisecond, func() bool {
		return strings.Contains(logs.String(), `prefix: \"delaybridge\" here, \"shop\" there`)
	}) {
		t.Fatalf("the relay logged no difference naming both prefixes: %q", logs.String())
	}
	time.Sleep(100 * time.Millisecond) // several more heartbeats
	if n := strings.Count(logs.String(), "topology differs"); n != 1 {
		t.Fatalf("the difference was logged %d times, want once", n)
	}
}

func TestAnnounce_RefusesBadPresences(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, p := range map[string]outbox.Presence{
		"no role":      {Topology: rabbitTopology("x")},
		"no broker":    {Role: outbox.RoleRelay},
		"bad topic":    {Role: outbox.RoleConsumer, Topology: rabbitTopology("x"), Topics: []string{"a b"}},
		"bad instance": {Instance: "two words", Role: outbox.RoleRelay, Topology: rabbitTopology("x")},
	} {
		if a, err := outbox.Announce(b.ctx, b.db, p, outbox.PresenceConfig{Logger: quiet()}); err == nil {
			_ = a.Close(b.ctx)
			t.Errorf("%s: Announce accepted %+v", name, p)
		}
	}
	if n := b.countPresences(t); n != 0 {
		t.Fatalf("%d presences recorded from bad input", n)
	}
}

func (b *bundle) countPresences(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.db.QueryRowContext(b.ctx, "SELECT COUNT(*) FROM delaybridge_presence").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
