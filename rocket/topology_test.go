package rocket_test

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/rocket"
)

func TestConfigTopology_CarriesGroupPrefixModeAndLimits(t *testing.T) {
	topo, err := rocket.Config{NameServers: []string{"127.0.0.1:9876"}, GroupPrefix: "shop",
		Limits: rocket.LevelLimits([]time.Duration{time.Second, 5 * time.Second}, 0)}.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if topo.Broker != "rocket" || topo.Settings["group_prefix"] != "shop" || topo.Settings["mode"] != "levels" || topo.Settings["levels"] != "1s 5s" {
		t.Fatalf("Topology = %+v", topo)
	}
	def, err := rocket.Config{NameServers: []string{"127.0.0.1:9876"}}.Topology()
	if err != nil || def.Settings["group_prefix"] != rocket.DefaultGroupPrefix || def.Settings["mode"] != "timer" {
		t.Fatalf("default Topology = %+v, %v", def, err)
	}
}
