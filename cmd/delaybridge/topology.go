package main

import (
	"context"
	"database/sql"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/ops"
)

var descUnconsumed = prometheus.NewDesc("delaybridge_outbox_unconsumed_overdue_tasks",
	"Published tasks overdue by more than the grace, of topics no live consumer announced itself for (a consumer with another prefix or group, or none). Counted among the oldest 10,000 overdue tasks.",
	[]string{"topic"}, nil)

// unconsumedCollector exports ops.Unconsumed at scrape time: one
// bounded range of the (state, due_ms) index and the small presence table.
type unconsumedCollector struct {
	db        *sql.DB
	grace     time.Duration
	log       *slog.Logger
	maxTopics *int // the outbox collector's bound (run --metrics-topics)
}

func (c *unconsumedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descUnconsumed }

func (c *unconsumedCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	topics, err := ops.Unconsumed(ctx, c.db, time.Now(), c.grace, cli.PresenceExpiry)
	if err != nil {
		// delaybridge_outbox_up already reports an unreadable outbox.
		c.log.Warn("delaybridge metrics: reading unconsumed topics failed", "err", err)
		return
	}
	for topic, n := range capTopics(topics, *c.maxTopics) {
		ch <- prometheus.MustNewConstMetric(descUnconsumed, prometheus.GaugeValue, float64(n), topic)
	}
}

// statusJSON is status --json: the outbox's figures and the overdue topics
// without a live consumer.
type statusJSON struct {
	Shard string `json:"shard,omitempty"`
	*ops.Stats
	Unconsumed map[string]int `json:"unconsumed_overdue"`
}
