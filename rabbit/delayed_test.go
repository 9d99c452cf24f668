package rabbit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// The test broker has no rabbitmq_delayed_message_exchange plugin, so only
// its detection is tested; the delayed-exchange mode itself is untested here.
func TestDelayedExchange_MissingPluginFailsConstructionNamingLadderMode(t *testing.T) {
	b := setup(t)
	cfg := b.cfg
	cfg.Mode = ModeDelayedExchange
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub, err := NewPublisher(ctx, cfg)
	if err == nil {
		_ = pub.Close()
		// The detection can only be proved on a broker without the plugin,
		// which is what scripts/services.sh installs.
		t.Fatal("this broker has the delayed-message plugin; the test needs the one scripts/services.sh installs, without it")
	}
	t.Log(err)
	if !errors.Is(err, ErrPluginMissing) || !strings.Contains(err.Error(), "ladder") || !strings.Contains(err.Error(), "unknown exchange type") {
		t.Errorf("err = %v, want ErrPluginMissing naming ladder mode and the broker's answer", err)
	}
	sub, err := NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, err := sub.Subscribe(ctx, "delayed"); !errors.Is(err, ErrPluginMissing) {
		t.Errorf("Subscribe err = %v, want ErrPluginMissing", err)
	}
}

func TestDelayedExchange_LimitsHopPastThePluginMaximum(t *testing.T) {
	cfg, err := Config{URL: "amqp://x", Mode: ModeDelayedExchange}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.limits(); l.MaxHop != 4294967295*time.Millisecond {
		t.Errorf("MaxHop %v, want 2^32-1 ms", l.MaxHop)
	}
	x, key, ms := topology{cfg: cfg}.delayedRoute(100*24*time.Hour, "t")
	if x != "delaybridge.delayed" || key != "t" || ms != 4294967295 {
		t.Errorf("delayedRoute = %s %s %d", x, key, ms)
	}
}
