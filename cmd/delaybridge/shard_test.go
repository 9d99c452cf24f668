package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestShardFlags_ParseNamesAndDSNsAndRefuseTheRest(t *testing.T) {
	file := filepath.Join(t.TempDir(), "b.dsn")
	if err := os.WriteFile(file, []byte("u:filepw@tcp(127.0.0.1:3307)/o\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := shardFlags{raw: []string{"a=u:pw@tcp(127.0.0.1:3306)/o?parseTime=true", "shard_B-2=@" + file}}
	got, err := good.parse()
	if err != nil {
		t.Fatal(err)
	}
	want := []shard{{"a", "u:pw@tcp(127.0.0.1:3306)/o?parseTime=true"}, {"shard_B-2", "u:filepw@tcp(127.0.0.1:3307)/o"}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("parsed %+v, want %+v", got, want)
	}
	for _, tc := range []struct {
		name string
		raw  []string
		want string
	}{
		{"no name", []string{"=u:secretpw@tcp(h:1)/o"}, "want NAME=DSN"},
		{"no equals sign", []string{"u:secretpw@tcp(h:1)/o"}, "want NAME=DSN"},
		{"illegal name", []string{"a b=u:secretpw@tcp(h:1)/o"}, "want NAME=DSN"},
		{"name too long", []string{strings.Repeat("n", 65) + "=u:secretpw@tcp(h:1)/o"}, "want NAME=DSN"},
		{"twice", []string{"a=u:secretpw@tcp(h:1)/o", "a=u:secretpw@tcp(h:2)/o"}, "--shard a given twice"},
		{"bad DSN", []string{"a=u:secretpw@tcp(h:1)o"}, "--shard a: DSN"},
		{"address without its network", []string{"a=u:secretpw@127.0.0.1:3306/o"}, "the address needs its network, as in tcp(host:3306)"},
		{"a URL", []string{"a=mysql://u:secretpw@h:3306/o"}, "it is a mysql:// URL, want the go-sql-driver form"},
		{"missing file", []string{"a=@/nonexistent/dsn"}, "--shard a:"},
		{"empty DSN", []string{"a=u:secretpw@tcp(h:1)/o", "b="}, "--shard b: empty DSN"},
		{"blank DSN", []string{"b= "}, "--shard b: empty DSN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := (&shardFlags{raw: tc.raw}).parse()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "secretpw") {
				t.Fatalf("error shows the password: %v", err)
			}
		})
	}
}

func TestShardGatherer_LabelsEverySeriesWithTheShard(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"topic"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "y", Help: "y"})
	reg.MustRegister(c, g)
	c.WithLabelValues("orders").Add(2)
	g.Set(3)
	mfs, err := shardGatherer(reg, "eu-1").Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			var labels []string
			for _, l := range m.Label {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			got = append(got, mf.GetName()+"{"+strings.Join(labels, ",")+"}")
		}
	}
	if want := []string{"x_total{shard=eu-1,topic=orders}", "y{shard=eu-1}"}; !slices.Equal(got, want) {
		t.Fatalf("gathered %q, want %q", got, want)
	}
	// The registry itself is left unlabelled.
	if mfs, _ := reg.Gather(); len(mfs[1].Metric[0].Label) != 0 {
		t.Fatalf("the registry's own series gained labels: %v", mfs[1].Metric[0].Label)
	}
	if shardGatherer(reg, "") != prometheus.Gatherer(reg) {
		t.Fatal("an unnamed shard wrapped the registry")
	}
}

// TestStatusAndDoctor_CoverEveryShardAndNameIt runs status and doctor over
// two outbox databases and a third that cannot be reached: the two are
// reported under their names, the third fails by name without hiding them.
func TestStatusAndDoctor_CoverEveryShardAndNameIt(t *testing.T) {
	t.Setenv("DELAYBRIDGE_MYSQL_DSN", "")
	dsnA, dsnB := scratch(t), scratch(t)
	ctx := context.Background()
	for dsn, n := range map[string]int{dsnA: 2, dsnB: 3} {
		pool := openDSN(t, dsn)
		for i := range n {
			if _, err := outbox.Schedule(ctx, pool, outbox.Task{Topic: "orders", Key: string(rune('k' + i)), DueAt: time.Now().Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	shards := []string{"--shard", "a=" + dsnA, "--shard", "b=" + dsnB}

	out := mustRun(t, append([]string{"status", "--json"}, shards...)...)
	dec := json.NewDecoder(strings.NewReader(out))
	pending := map[string]int{}
	for dec.More() {
		var st struct {
			Shard string
			ops.Stats
		}
		if err := dec.Decode(&st); err != nil {
			t.Fatalf("%v in\n%s", err, out)
		}
		pending[st.Shard] = st.Backlog[outbox.StatePending]["orders"]
	}
	if len(pending) != 2 || pending["a"] != 2 || pending["b"] != 3 {
		t.Fatalf("pending by shard %v, want a:2 b:3\n%s", pending, out)
	}
	out = mustRun(t, append([]string{"status"}, shards...)...)
	if a, b := strings.Index(out, "== shard a\n"), strings.Index(out, "== shard b\n"); a < 0 || b < a {
		t.Fatalf("status table does not name both shards in order:\n%s", out)
	}

	dead := "c=delaybridge:secretpw@tcp(127.0.0.1:1)/delaybridge"
	out, _, err := run(t, append([]string{"status", "--shard", dead}, shards...)...)
	if err == nil || !strings.Contains(err.Error(), "1 of 3 shards failed: shard c: database") || !strings.Contains(out, "== shard b\n") {
		t.Fatalf("status with shard c down: err %v\n%s", err, out)
	}
	if strings.Contains(err.Error()+out, "secretpw") {
		t.Fatalf("status printed a shard's password: %v", err)
	}

	out, _, err = run(t, append(append([]string{"doctor", "--shard", dead}, shards...), testenv.RabbitFlags(t)...)...)
	for _, want := range []string{"OK    shard a: outbox schema at version", "OK    shard b: outbox schema at version", "FAIL  shard c: database", "OK    RabbitMQ 3."} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor lacks %q", want)
		}
	}
	if err == nil || strings.Contains(out, "secretpw") {
		t.Errorf("doctor with shard c down: err %v", err)
	}
	if t.Failed() {
		t.Fatalf("doctor printed:\n%s", out)
	}

	if _, _, err := run(t, append([]string{"status", "--mysql-dsn", dsnA}, shards...)...); err == nil || !strings.Contains(err.Error(), "--mysql-dsn and --shard are both set") {
		t.Fatalf("status with --mysql-dsn and --shard: %v", err)
	}
}
