package delaybridge_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/broker"
)

// A process that runs only a consumer exports no relay or scanner series:
// zeros of parts it does not run would read as a stalled relay.
func TestClient_MetricsOfAConsumerOnlyProcessHaveNoRelayOrScannerSeries(t *testing.T) {
	b := setup(t)
	reg := prometheus.NewRegistry()
	m, err := delaybridge.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	b.cfg.Relay = nil
	b.cfg.Metrics = m
	c, err := delaybridge.NewClient(b.db, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Handle("metered", func(context.Context, *sql.Tx, *broker.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background()) //nolint:errcheck
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if n := mf.GetName(); strings.HasPrefix(n, "delaybridge_relay_") || strings.HasPrefix(n, "delaybridge_scanner_") {
			t.Errorf("a consumer-only process exports %s", n)
		}
	}
}
