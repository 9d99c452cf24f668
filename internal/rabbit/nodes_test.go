package rabbit

import (
	"slices"
	"strings"
	"testing"
)

func TestNodeRing_EachNodeTakesTheURLsCredentialsAndDialsRotate(t *testing.T) {
	r, err := newNodeRing("amqps://u:p%40ss@n1:5671/vh?heartbeat=5", []string{"n2:5671", "10.0.0.3:5671"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"amqps://u:p%40ss@n1:5671/vh?heartbeat=5", "amqps://u:p%40ss@n2:5671/vh?heartbeat=5", "amqps://u:p%40ss@10.0.0.3:5671/vh?heartbeat=5"}
	if !slices.Equal(r.urls, want) {
		t.Fatalf("urls %q, want %q", r.urls, want)
	}
	urls, first := r.order()
	if first != 0 || !slices.Equal(urls, want) {
		t.Fatalf("first dial order %q from %d", urls, first)
	}
	// The dial reached the second node it tried: the next starts after it.
	r.reached(first, 1)
	urls, first = r.order()
	if first != 2 || !slices.Equal(urls, []string{want[2], want[0], want[1]}) {
		t.Fatalf("after reaching n2: order %q from %d", urls, first)
	}
	r.reached(first, 0)
	if urls, first = r.order(); first != 0 || urls[0] != want[0] {
		t.Fatalf("after reaching n3: order %q from %d", urls, first)
	}
	if !slices.Equal(r.urls, want) {
		t.Fatalf("order changed the ring itself: %q", r.urls)
	}
}

func TestNodeRing_RefusesWhatIsNotAnotherNode(t *testing.T) {
	for _, nodes := range [][]string{{"n2"}, {"n2:"}, {":5672"}, {"n2:port"}, {"n2:70000"}, {"u:pw@n2:5672"}, {"n2:5672/vh"}, {"n1:5672"}, {"n2:5672", "N2:5672"}} {
		_, err := Config{URL: "amqp://u:secretpw@n1:5672/", Nodes: nodes}.withDefaults()
		if err == nil || !strings.Contains(err.Error(), "Config.Nodes[") {
			t.Errorf("Nodes %q: err %v", nodes, err)
		}
		if err != nil && strings.Contains(err.Error(), "secretpw") {
			t.Errorf("Nodes %q: the error shows the password: %v", nodes, err)
		}
	}
	if c, err := (Config{URL: "amqp://u:p@n1:5672/"}).withDefaults(); err != nil || len(c.ring.urls) != 1 {
		t.Fatalf("no Nodes: %v, ring %v", err, c.ring)
	}
}
