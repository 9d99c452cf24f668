package broker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
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

func TestLimitSettings_IncludeLevelsOnlyWhenSet(t *testing.T) {
	s := broker.LimitSettings(broker.Limits{MaxHop: time.Hour, Levels: []time.Duration{time.Second, 5 * time.Second}})
	if s["max_hop"] != "1h0m0s" || s["levels"] != "1s 5s" {
		t.Fatalf("LimitSettings = %v", s)
	}
	if _, ok := broker.LimitSettings(broker.Limits{MaxHop: time.Hour})["levels"]; ok {
		t.Fatal("levels set without levels")
	}
}
