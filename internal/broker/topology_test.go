package broker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
)

func TestTopologyDiff_NamesBothValuesOfSharedSettings(t *testing.T) {
	here := broker.Topology{Broker: "rabbit", Settings: map[string]string{"prefix": "shop", "mode": "ladder", "unit": "100ms"}}
	there := broker.Topology{Broker: "rabbit", Settings: map[string]string{"prefix": "delaybridge", "mode": "ladder"}}
	got := here.Diff(there)
	if len(got) != 1 || got[0] != `prefix: "shop" here, "delaybridge" there` {
		t.Fatalf("Diff = %q", got)
	}
	if d := here.Diff(here); len(d) != 0 {
		t.Fatalf("a topology differs from itself: %q", d)
	}
	other := broker.Topology{Broker: "rocket", Settings: map[string]string{"prefix": "shop"}}
	if d := here.Diff(other); len(d) != 1 || !strings.HasPrefix(d[0], "broker:") {
		t.Fatalf("Diff across brokers = %q", d)
	}
	if s := here.String(); s != "rabbit mode=ladder prefix=shop unit=100ms" {
		t.Fatalf("String = %q", s)
	}
}

func TestLimitSettings_LevelsAndTheLongestUsableHop(t *testing.T) {
	levels := []time.Duration{time.Second, 5 * time.Second, time.Minute}
	s := broker.LimitSettings(broker.Limits{MaxHop: 72 * time.Hour, Levels: levels})
	if s["max_hop"] != "1m0s" || s["levels"] != "1s 5s 1m0s" {
		t.Fatalf("LimitSettings = %v", s)
	}
	// MaxHop 0 (all levels) and MaxHop above the last level are the same limits.
	if z := broker.LimitSettings(broker.Limits{Levels: levels}); z["max_hop"] != s["max_hop"] {
		t.Fatalf("max_hop %s with MaxHop 0, %s with 72h", z["max_hop"], s["max_hop"])
	}
	if c := broker.LimitSettings(broker.Limits{MaxHop: 10 * time.Second, Levels: levels}); c["max_hop"] != "5s" {
		t.Fatalf("max_hop %s with MaxHop 10s, want the 5s level", c["max_hop"])
	}
	if _, ok := broker.LimitSettings(broker.Limits{MaxHop: time.Hour})["levels"]; ok {
		t.Fatal("levels set without levels")
	}
}
