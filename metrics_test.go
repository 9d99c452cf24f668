package delaybridge_test

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/broker"
)

// A Client with Metrics feeds the series the dashboard reads from the
// consumer and the relay it runs, and the hooks set in its Config still
// run beside them.
func TestClient_MetricsCountWhatItsConsumerAndRelayDid(t *testing.T) {
	b := setup(t)
	reg := prometheus.NewRegistry()
	m, err := delaybridge.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var settled atomic.Int64
	b.cfg.Metrics = m
	b.cfg.Consumer.Hooks.Settled = func(string, broker.Outcome, string) { settled.Add(1) }
	c, err := delaybridge.NewClient(b.db, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	if err := c.Handle("metered", func(context.Context, *sql.Tx, *broker.Message) error { handled.Add(1); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	b.schedule(t, c, "metered", "k1")
	b.schedule(t, c, "metered", "k2")
	want := map[string]float64{
		"delaybridge_lateness_seconds":        2,
		"delaybridge_consumer_outcomes_total": 2,
		"delaybridge_relay_published_total":   2,
	}
	// The hooks run after the work they count (the relay's after its mark,
	// which may come after the consumer's ack): wait for all of them.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		missing := settled.Load() < 2
		for name, n := range want {
			missing = missing || sum(t, reg, name) < n
		}
		if !missing {
			break
		}
		if time.Now().After(deadline) {
			break
		}
	}
	for name, n := range want {
		if got := sum(t, reg, name); got != n {
			t.Errorf("%s = %v, want %v", name, got, n)
		}
	}
	if handled.Load() != 2 || settled.Load() != 2 {
		t.Errorf("handler ran %d times, the Config's Settled hook saw %d; want 2 and 2", handled.Load(), settled.Load())
	}
	if _, err := delaybridge.NewMetrics(reg); err == nil {
		t.Error("NewMetrics registered its series twice in one registry")
	}
}

// sum adds up the series of family name in reg: a counter's values, a
// histogram's sample counts.
func sum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			switch {
			case s.Counter != nil:
				total += s.GetCounter().GetValue()
			case s.Histogram != nil:
				total += float64(s.GetHistogram().GetSampleCount())
			}
		}
	}
	return total
}

// NewMetrics without a registerer is an error, not a panic.
func TestNewMetrics_RefusesANilRegisterer(t *testing.T) {
	if m, err := delaybridge.NewMetrics(nil); err == nil || m != nil {
		t.Fatalf("NewMetrics(nil) = %v, %v; want an error", m, err)
	}
}
