package rabbit_test

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/rabbit"
)

func TestConfigTopology_CarriesPrefixModeAndLadder(t *testing.T) {
	topo, err := rabbit.Config{URL: "amqp://u:p@localhost:5672/", Prefix: "shop", Unit: 50 * time.Millisecond, Depth: 10}.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if topo.Broker != "rabbit" || topo.Settings["prefix"] != "shop" || topo.Settings["mode"] != rabbit.ModeLadder.String() ||
		topo.Settings["unit"] != "50ms" || topo.Settings["depth"] != "10" || topo.Settings["max_hop"] != rabbit.LadderMaxHop(50*time.Millisecond, 10).String() {
		t.Fatalf("Topology = %+v", topo)
	}
	def, err := rabbit.Config{URL: "amqp://u:p@localhost:5672/"}.Topology()
	if err != nil || def.Settings["prefix"] != rabbit.DefaultPrefix {
		t.Fatalf("default Topology = %+v, %v", def, err)
	}
	if _, err := (rabbit.Config{}).Topology(); err == nil {
		t.Fatal("a Config without URL gave a topology")
	}
}
