package rocket_test

import (
	"maps"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/rocket"
)

func TestConfigTopology_CarriesModeAndLimits(t *testing.T) {
	topo, err := rocket.Config{NameServers: []string{"127.0.0.1:9876"},
		Limits: rocket.LevelLimits([]time.Duration{time.Second, 5 * time.Second}, 0)}.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if topo.Broker != "rocket" || topo.Settings["mode"] != "levels" || topo.Settings["levels"] != "1s 5s" {
		t.Fatalf("Topology = %+v", topo)
	}
	def, err := rocket.Config{NameServers: []string{"127.0.0.1:9876"}}.Topology()
	if err != nil || def.Settings["mode"] != "timer" {
		t.Fatalf("default Topology = %+v, %v", def, err)
	}
}

// The group prefix names consumer groups only: a relay (which has none)
// and a service with another prefix must not count as a mismatch, or the
// second service on an outbox could not start beside delaybridge run.
func TestConfigTopology_TheGroupPrefixIsNoMismatch(t *testing.T) {
	relay, err := rocket.Config{NameServers: []string{"127.0.0.1:9876"}}.Topology()
	if err != nil {
		t.Fatal(err)
	}
	shop, err := rocket.Config{NameServers: []string{"127.0.0.1:9876"}, GroupPrefix: "shop"}.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if relay.Broker != shop.Broker || !maps.Equal(relay.Settings, shop.Settings) {
		t.Fatalf("topologies differ by the group prefix: %+v against %+v", relay, shop)
	}
}
