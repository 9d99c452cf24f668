package main

import (
	"context"
	"database/sql"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/outbox"
	"github.com/delaybridge/delaybridge/scanner"
)

// metrics are the Prometheus series delaybridge exports. Labels carry only
// topics and states, never keys, payloads or connection settings.
type metrics struct {
	reg *prometheus.Registry

	relayPublished prometheus.Counter
	relayFailed    prometheus.Counter
	relayDead      prometheus.Counter
	relayLatency   prometheus.Histogram
	rescued        prometheus.Counter
	business       prometheus.Counter

	lateness *prometheus.HistogramVec
	hops     *prometheus.CounterVec
	retries  *prometheus.CounterVec
	dead     *prometheus.CounterVec
	stuck    *prometheus.CounterVec
	outcomes *prometheus.CounterVec
	groups   *prometheus.HistogramVec

	// outbox exports the outbox's counts, unconsumed the overdue topics
	// without a live consumer; nil without a database.
	outbox     *outboxCollector
	unconsumed *unconsumedCollector
	// shard, when set, labels every series shard=NAME (run --shard-name).
	shard string
}

func newMetrics(db *sql.DB, grace time.Duration, log *slog.Logger) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.relayPublished = prometheus.NewCounter(prometheus.CounterOpts{Name: "delaybridge_relay_published_total", Help: "Tasks the relay published and marked published."})
	m.relayFailed = prometheus.NewCounter(prometheus.CounterOpts{Name: "delaybridge_relay_failed_total", Help: "Task publishes that failed transiently and will be retried."})
	m.relayDead = prometheus.NewCounter(prometheus.CounterOpts{Name: "delaybridge_relay_dead_total", Help: "Tasks the broker rejected for good."})
	m.relayLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "delaybridge_relay_publish_seconds", Help: "Time to publish one relay batch and receive its confirms.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)})
	m.rescued = prometheus.NewCounter(prometheus.CounterOpts{Name: "delaybridge_scanner_rescued_total", Help: "Overdue published tasks the scanner published again."})
	m.business = prometheus.NewCounter(prometheus.CounterOpts{Name: "delaybridge_scanner_business_handled_total", Help: "Keys the scanner's business source handled."})
	m.lateness = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "delaybridge_lateness_seconds", Help: "Handler start time minus due time.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}}, []string{"topic"})
	m.hops = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delaybridge_hops_total", Help: "Early messages published again as another hop."}, []string{"topic"})
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delaybridge_retries_total", Help: "Failed handler runs scheduled for a retry."}, []string{"topic"})
	m.dead = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delaybridge_dead_total", Help: "Messages the runtime gave up on."}, []string{"topic"})
	m.stuck = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delaybridge_stuck_handlers_total", Help: "Handlers abandoned because they ran past HandlerTimeout plus HandlerGrace."}, []string{"topic"})
	m.outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delaybridge_consumer_outcomes_total",
		Help: "Deliveries the consumer runtime settled, by outcome (applied, skipped, retried, dead) and, for skipped, reason (done, cancelled, stale, missing, dead)."},
		[]string{"topic", "outcome", "reason"})
	m.groups = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "delaybridge_consumer_group_size",
		Help:    "Messages one group-commit transaction handled (groups of two or more; a lone due message runs on its own).",
		Buckets: []float64{2, 5, 10, 20, 50, 100, 200, 500}}, []string{"topic"})
	m.reg.MustRegister(m.relayPublished, m.relayFailed, m.relayDead, m.relayLatency, m.rescued, m.business, m.lateness, m.hops, m.retries, m.dead, m.stuck, m.outcomes, m.groups,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if db != nil {
		// No lateness window: the consumers export lateness themselves.
		read := func(ctx context.Context, now time.Time) (*outbox.Stats, error) {
			return outbox.ReadStats(ctx, db, now, grace, 0)
		}
		m.outbox = &outboxCollector{read: read, log: log, maxTopics: maxTopicSeries}
		m.unconsumed = &unconsumedCollector{db: db, grace: grace, log: log, maxTopics: &m.outbox.maxTopics}
		m.reg.MustRegister(m.outbox, m.unconsumed)
	}
	return m
}

func (m *metrics) relayHooks() outbox.RelayHooks {
	return outbox.RelayHooks{
		Published: func(n int, took time.Duration) {
			m.relayPublished.Add(float64(n))
			m.relayLatency.Observe(took.Seconds())
		},
		Failed: func(n int) { m.relayFailed.Add(float64(n)) },
		Dead:   func(n int) { m.relayDead.Add(float64(n)) },
	}
}

func (m *metrics) scannerHooks() scanner.Hooks {
	return scanner.Hooks{
		Rescued:         func(n int) { m.rescued.Add(float64(n)) },
		BusinessHandled: func(n int) { m.business.Add(float64(n)) },
	}
}

func (m *metrics) consumerHooks() broker.Hooks {
	return broker.Hooks{
		Handled: func(topic string, l time.Duration) { m.lateness.WithLabelValues(topic).Observe(l.Seconds()) },
		Hopped:  func(topic string, _ int) { m.hops.WithLabelValues(topic).Inc() },
		Retried: func(topic string, _ int) { m.retries.WithLabelValues(topic).Inc() },
		Dead:    func(topic string, _ error) { m.dead.WithLabelValues(topic).Inc() },
		Stuck:   func(topic string) { m.stuck.WithLabelValues(topic).Inc() },
		Grouped: func(topic string, n int, _ time.Duration) { m.groups.WithLabelValues(topic).Observe(float64(n)) },
		Settled: func(topic string, o broker.Outcome, reason string) {
			m.outcomes.WithLabelValues(topic, string(o), skipLabel(reason)).Inc()
		},
	}
}

// skipLabel bounds the reason label to the reasons outbox reports: a
// custom handler's broker.Skip reason is free text, and a series per text
// would grow without end.
func skipLabel(reason string) string {
	switch reason {
	case "", "done", "cancelled", "stale", "missing", "dead":
		return reason
	}
	return "other"
}

// outboxCollector reads the outbox backlog at scrape time: the summary the
// stats refresher keeps, and bounded index ranges, so a scrape costs the
// same however large the outbox. One read is in
// flight at a time: a scrape that arrives during one waits for it and
// reports its result, so concurrent scrapes cost the database one set of
// queries, not one each.
type outboxCollector struct {
	read func(ctx context.Context, now time.Time) (*outbox.Stats, error)
	log  *slog.Logger
	// maxTopics bounds the topic series per state (run --metrics-topics).
	maxTopics int

	mu       sync.Mutex
	inFlight *statsRead
}

// statsRead is one read of the outbox that scrapes share; done closes when
// st and err are set.
type statsRead struct {
	done chan struct{}
	now  time.Time
	st   *outbox.Stats
	err  error
}

// stats joins the read in flight or starts one.
func (c *outboxCollector) stats() *statsRead {
	c.mu.Lock()
	if r := c.inFlight; r != nil {
		c.mu.Unlock()
		<-r.done
		return r
	}
	r := &statsRead{done: make(chan struct{}), now: time.Now()}
	c.inFlight = r
	c.mu.Unlock()
	// Deferred, so a read that panics cannot leave later scrapes waiting.
	defer func() {
		c.mu.Lock()
		c.inFlight = nil
		c.mu.Unlock()
		close(r.done)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.st, r.err = c.read(ctx, r.now)
	return r
}

var (
	descTasks    = prometheus.NewDesc("delaybridge_outbox_tasks", "Unfinished tasks by state and topic.", []string{"state", "topic"}, nil)
	descFinished = prometheus.NewDesc("delaybridge_outbox_finished_tasks", "Finished tasks still kept, by state.", []string{"state"}, nil)
	descOverdue  = prometheus.NewDesc("delaybridge_outbox_overdue_tasks", "Published tasks overdue by more than the grace.", nil, nil)
	descOldest   = prometheus.NewDesc("delaybridge_outbox_oldest_pending_age_seconds", "Now minus the due time of the oldest pending task (0 when none or not due).", nil, nil)
	descUp       = prometheus.NewDesc("delaybridge_outbox_up", "1 when the last scrape could read the outbox.", nil, nil)
	descStatsAge = prometheus.NewDesc("delaybridge_outbox_stats_age_seconds", "Age of the background count the task and finished-task series come from (absent until one exists).", nil, nil)
)

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descTasks, descFinished, descOverdue, descOldest, descUp, descStatsAge} {
		ch <- d
	}
}

// maxTopicSeries is the default bound on the topic series per state:
// producers choose topic names, and a series per topic would let them grow
// every scrape without end.
const maxTopicSeries = 200

// otherTopics labels the sum of the topics past maxTopicSeries; it is not
// a legal topic name, so it never collides with one.
const otherTopics = "(other)"

// capTopics keeps the n topics with the most tasks (ties by name) and adds
// the rest up under otherTopics.
func capTopics(topics map[string]int, n int) map[string]int {
	if len(topics) <= n {
		return topics
	}
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := topics[names[i]], topics[names[j]]
		return a > b || a == b && names[i] < names[j]
	})
	out := make(map[string]int, n+1)
	for i, t := range names {
		if i < n {
			out[t] = topics[t]
		} else {
			out[otherTopics] += topics[t]
		}
	}
	return out
}

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.stats()
	if r.err != nil {
		c.log.Warn("delaybridge metrics: reading the outbox failed", "err", r.err)
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 0)
		return
	}
	st, now := r.st, r.now
	ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 1)
	// Before the first background count there are no counts: absent series,
	// not zeros that would read as an empty outbox.
	if !st.CountsAt.IsZero() {
		ch <- prometheus.MustNewConstMetric(descStatsAge, prometheus.GaugeValue, max(0, st.CountsAge.Seconds()))
		for state, topics := range st.Backlog {
			for topic, n := range capTopics(topics, c.maxTopics) {
				ch <- prometheus.MustNewConstMetric(descTasks, prometheus.GaugeValue, float64(n), string(state), topic)
			}
		}
		ch <- prometheus.MustNewConstMetric(descFinished, prometheus.GaugeValue, float64(st.Done), "done")
		ch <- prometheus.MustNewConstMetric(descFinished, prometheus.GaugeValue, float64(st.Cancelled), "cancelled")
	}
	ch <- prometheus.MustNewConstMetric(descOverdue, prometheus.GaugeValue, float64(st.Overdue))
	age := 0.0
	if !st.OldestPendingDue.IsZero() && now.After(st.OldestPendingDue) {
		age = now.Sub(st.OldestPendingDue).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, age)
}
