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

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// metrics are the Prometheus series a delaybridge process exports: the
// relay's, the scanner's and the consumer's (delaybridge.Metrics, fed by
// their hooks), the outbox's counts read at scrape time, and the Go
// runtime's and the process's. Labels carry only topics, states and
// outcomes, never keys, payloads or connection settings.
type metrics struct {
	*delaybridge.Metrics
	reg *prometheus.Registry

	// outbox exports the outbox's counts, unconsumed the overdue topics
	// without a live consumer, presence the live processes; nil without a
	// database.
	outbox     *outboxCollector
	unconsumed *unconsumedCollector
	presence   *presenceCollector
	// shard, when set, labels every series shard=NAME (run --shard-name).
	shard string
}

func newMetrics(db *sql.DB, grace time.Duration, log *slog.Logger) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	var err error
	if m.Metrics, err = delaybridge.NewMetrics(m.reg); err != nil {
		panic(err) // a new registry holds nothing to collide with
	}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if db != nil {
		// No lateness window: the consumers export lateness themselves.
		read := func(ctx context.Context, now time.Time) (*ops.Stats, error) {
			return ops.ReadStats(ctx, db, now, grace, 0)
		}
		m.outbox = &outboxCollector{read: read, log: log, maxTopics: maxTopicSeries}
		m.unconsumed = &unconsumedCollector{db: db, grace: grace, log: log, maxTopics: &m.outbox.maxTopics}
		m.presence = &presenceCollector{db: db, log: log}
		m.reg.MustRegister(m.outbox, m.unconsumed, m.presence)
	}
	return m
}

// outboxCollector reads the outbox backlog at scrape time: the summary the
// stats refresher keeps, and bounded index ranges, so a scrape costs the
// same however large the outbox. One read is in
// flight at a time: a scrape that arrives during one waits for it and
// reports its result, so concurrent scrapes cost the database one set of
// queries, not one each.
type outboxCollector struct {
	read func(ctx context.Context, now time.Time) (*ops.Stats, error)
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
	st   *ops.Stats
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
	descTasks          = prometheus.NewDesc("delaybridge_outbox_tasks", "Unfinished tasks by state and topic.", []string{"state", "topic"}, nil)
	descFinished       = prometheus.NewDesc("delaybridge_outbox_finished_tasks", "Finished tasks still kept, by state.", []string{"state"}, nil)
	descOverdue        = prometheus.NewDesc("delaybridge_outbox_overdue_tasks", "Unfinished tasks (pending or published) more than the grace past due.", nil, nil)
	descOverduePending = prometheus.NewDesc("delaybridge_outbox_overdue_pending_tasks",
		"Pending tasks more than the grace past due: no relay publishes them (counted among the oldest 10,000).", nil, nil)
	descOldest   = prometheus.NewDesc("delaybridge_outbox_oldest_pending_age_seconds", "Now minus the due time of the oldest pending task (0 when none or not due).", nil, nil)
	descUp       = prometheus.NewDesc("delaybridge_outbox_up", "1 when the last scrape could read the outbox.", nil, nil)
	descStatsAge = prometheus.NewDesc("delaybridge_outbox_stats_age_seconds", "Age of the background count the task and finished-task series come from (absent until one exists).", nil, nil)
)

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descTasks, descFinished, descOverdue, descOverduePending, descOldest, descUp, descStatsAge} {
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
	ch <- prometheus.MustNewConstMetric(descOverduePending, prometheus.GaugeValue, float64(st.OverduePending))
	age := 0.0
	if !st.OldestPendingDue.IsZero() && now.After(st.OldestPendingDue) {
		age = now.Sub(st.OldestPendingDue).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, age)
}

var (
	descLive = prometheus.NewDesc("delaybridge_live_processes",
		"Relays and consumers whose presence heartbeat in the outbox's database is live, by role.", []string{"role"}, nil)
	descMismatches = prometheus.NewDesc("delaybridge_topology_mismatches",
		"Broker settings that differ between live relays and consumers (prefix, group, ladder): their tasks sit in queues nobody reads.", nil, nil)
)

// presenceCollector exports what the presence table says at scrape time:
// live processes by role (a relay whose pending tasks go past due with
// none live is stuck) and topology mismatches. It reads one small table.
type presenceCollector struct {
	db  *sql.DB
	log *slog.Logger
}

func (c *presenceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLive
	ch <- descMismatches
}

func (c *presenceCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	live, err := outbox.LivePresences(ctx, c.db, cli.PresenceExpiry)
	if err != nil {
		// delaybridge_outbox_up already reports an unreadable outbox.
		c.log.Warn("delaybridge metrics: reading the live processes failed", "err", err)
		return
	}
	n := map[outbox.Role]int{outbox.RoleRelay: 0, outbox.RoleConsumer: 0}
	for _, p := range live {
		if _, ok := n[p.Role]; ok {
			n[p.Role]++
		}
	}
	for role, k := range n {
		ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, float64(k), string(role))
	}
	ch <- prometheus.MustNewConstMetric(descMismatches, prometheus.GaugeValue, float64(len(ops.TopologyMismatches(live))))
}
