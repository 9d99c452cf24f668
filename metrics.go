package delaybridge

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
)

// Metrics are the Prometheus series of a relay, a scanner and a consumer
// runtime: delaybridge_relay_*, delaybridge_scanner_*, and the consumer's
// lateness, hops, retries, dead, stuck handlers, outcomes, group sizes and reruns
// by topic. The dashboard in deploy/grafana and the alert rules in
// deploy/prometheus read most of them (not the outcomes or the group
// sizes, which are for a closer look). Labels carry topics and outcomes,
// never keys, payloads or connection settings.
//
// A part's series are exported once it runs: from the first call of its
// hooks (RelayHooks, ScannerHooks, ConsumerHooks, which a Client makes for
// what it runs), so a process shows no zero series of a part it does not
// run.
//
// delaybridge run exports the relay's and the scanner's. The consumer runs
// in the service that owns the handlers, so that service exports the
// consumer's: set Config.Metrics and a Client feeds them from everything it
// runs, or pass ConsumerHooks (RelayHooks, ScannerHooks) to the pieces you
// build yourself. One Metrics may serve several Clients.
type Metrics struct {
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
	reruns   *prometheus.CounterVec
	limited  *prometheus.CounterVec

	relay, scanner, consumer *part
}

// part is the series of one part (relay, scanner, consumer) as one
// collector: registered whole, so NewMetrics finds a clash at once, and
// collected only once the part runs.
type part struct {
	on atomic.Bool
	cs []prometheus.Collector
}

// Describe describes every series of the part, running or not.
func (p *part) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range p.cs {
		c.Describe(ch)
	}
}

// Collect collects the part's series once it runs.
func (p *part) Collect(ch chan<- prometheus.Metric) {
	if !p.on.Load() {
		return
	}
	for _, c := range p.cs {
		c.Collect(ch)
	}
}

// NewMetrics makes the series and registers them with reg (for example
// prometheus.DefaultRegisterer). It fails when reg already holds series of
// these names.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("delaybridge: NewMetrics needs a registerer (prometheus.DefaultRegisterer, or a registry of your own)")
	}
	m := &Metrics{
		relayPublished: prometheus.NewCounter(prometheus.CounterOpts{Name: "delaybridge_relay_published_total", Help: "Tasks the relay published and marked published."}),
		relayFailed:    prometheus.NewCounter(prometheus.CounterOpts{Name: "delaybridge_relay_failed_total", Help: "Task publishes that failed transiently and will be retried."}),
		relayDead:      prometheus.NewCounter(prometheus.CounterOpts{Name: "delaybridge_relay_dead_total", Help: "Tasks the relay marked dead: the broker rejected them for good, or no broker could carry the row (invalid)."}),
		relayLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "delaybridge_relay_publish_seconds", Help: "Time to publish one relay batch and receive its confirms.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		rescued:  prometheus.NewCounter(prometheus.CounterOpts{Name: "delaybridge_scanner_rescued_total", Help: "Overdue published tasks the scanner published again."}),
		business: prometheus.NewCounter(prometheus.CounterOpts{Name: "delaybridge_scanner_business_handled_total", Help: "Keys the scanner's business source handled."}),
		lateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "delaybridge_lateness_seconds", Help: "Handler start time minus due time.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}}, []string{"topic"}),
		hops:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delaybridge_hops_total", Help: "Early messages published again as another hop."}, []string{"topic"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delaybridge_retries_total", Help: "Failed handler runs scheduled for a retry."}, []string{"topic"}),
		dead:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delaybridge_dead_total", Help: "Messages the runtime gave up on."}, []string{"topic"}),
		stuck:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delaybridge_stuck_handlers_total", Help: "Handlers abandoned because they ran past HandlerTimeout plus HandlerGrace."}, []string{"topic"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delaybridge_consumer_outcomes_total",
			Help: "Deliveries the consumer runtime settled, by outcome (applied, skipped, retried, dead) and, for skipped, reason (done, cancelled, stale, missing, dead, snoozed)."},
			[]string{"topic", "outcome", "reason"}),
		groups: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "delaybridge_consumer_group_size",
			Help:    "Messages of the topic one committed group-commit transaction handled (a group holds two or more messages of one topic; a lone due message runs on its own).",
			Buckets: []float64{2, 5, 10, 20, 50, 100, 200, 500}}, []string{"topic"}),
		reruns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delaybridge_consumer_reruns_total",
			Help: "Handler runs repeated for a message because its group's transaction was rolled back after another message failed (broker.Message.Rerun)."}, []string{"topic"}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delaybridge_consumer_limited_seconds_total",
			Help: "Time deliveries of the topic waited, from due, for its RateLimit or MaxConcurrency: how far the bound holds the topic back."}, []string{"topic"}),
	}
	m.relay = &part{cs: []prometheus.Collector{m.relayPublished, m.relayFailed, m.relayDead, m.relayLatency}}
	m.scanner = &part{cs: []prometheus.Collector{m.rescued, m.business}}
	m.consumer = &part{cs: []prometheus.Collector{m.lateness, m.hops, m.retries, m.dead, m.stuck, m.outcomes, m.groups, m.reruns, m.limited}}
	for _, c := range []prometheus.Collector{m.relay, m.scanner, m.consumer} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("delaybridge: register metrics: %w", err)
		}
	}
	return m, nil
}

// RelayHooks feeds the delaybridge_relay_* series (outbox.RelayConfig.Hooks).
func (m *Metrics) RelayHooks() outbox.RelayHooks {
	m.relay.on.Store(true)
	return outbox.RelayHooks{
		Published: func(n int, took time.Duration) {
			m.relayPublished.Add(float64(n))
			m.relayLatency.Observe(took.Seconds())
		},
		Failed: func(n int) { m.relayFailed.Add(float64(n)) },
		Dead:   func(n int) { m.relayDead.Add(float64(n)) },
	}
}

// ScannerHooks feeds the delaybridge_scanner_* series (scanner.Config.Hooks).
func (m *Metrics) ScannerHooks() scanner.Hooks {
	m.scanner.on.Store(true)
	return scanner.Hooks{
		Rescued:         func(n int) { m.rescued.Add(float64(n)) },
		BusinessHandled: func(n int) { m.business.Add(float64(n)) },
	}
}

// ConsumerHooks feeds the consumer's series (broker.ConsumerConfig.Hooks).
func (m *Metrics) ConsumerHooks() broker.Hooks {
	m.consumer.on.Store(true)
	return broker.Hooks{
		Handled: func(topic string, l time.Duration) { m.lateness.WithLabelValues(topic).Observe(l.Seconds()) },
		Hopped:  func(topic string, _ int) { m.hops.WithLabelValues(topic).Inc() },
		Retried: func(topic string, _ int) { m.retries.WithLabelValues(topic).Inc() },
		Dead:    func(topic string, _ error) { m.dead.WithLabelValues(topic).Inc() },
		Stuck:   func(topic string) { m.stuck.WithLabelValues(topic).Inc() },
		Grouped: func(topic string, n int, _ time.Duration) { m.groups.WithLabelValues(topic).Observe(float64(n)) },
		Rerun:   func(topic string) { m.reruns.WithLabelValues(topic).Inc() },
		Limited: func(topic string, waited time.Duration) { m.limited.WithLabelValues(topic).Add(waited.Seconds()) },
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
	case "", "done", "cancelled", "stale", "missing", "dead", "snoozed":
		return reason
	}
	return "other"
}

// Hooks set in a Client's Config run beside its Metrics': each joined
// hook calls the Config's first, then the Metrics'.

func joinConsumerHooks(a, b broker.Hooks) broker.Hooks {
	return broker.Hooks{
		Handled: join2(a.Handled, b.Handled), Settled: join3(a.Settled, b.Settled), Hopped: join2(a.Hopped, b.Hopped),
		Retried: join2(a.Retried, b.Retried), Dead: join2(a.Dead, b.Dead), Grouped: join3(a.Grouped, b.Grouped), Stuck: join1(a.Stuck, b.Stuck),
		Rerun: join1(a.Rerun, b.Rerun), Limited: join2(a.Limited, b.Limited),
	}
}

func joinRelayHooks(a, b outbox.RelayHooks) outbox.RelayHooks {
	return outbox.RelayHooks{Published: join2(a.Published, b.Published), Failed: join1(a.Failed, b.Failed), Dead: join1(a.Dead, b.Dead), Claimed: join1(a.Claimed, b.Claimed)}
}

func joinScannerHooks(a, b scanner.Hooks) scanner.Hooks {
	return scanner.Hooks{Rescued: join1(a.Rescued, b.Rescued), Backlog: join2(a.Backlog, b.Backlog), BusinessHandled: join1(a.BusinessHandled, b.BusinessHandled)}
}

func join1[A any](f, g func(A)) func(A) {
	if f == nil {
		return g
	}
	if g == nil {
		return f
	}
	return func(a A) { f(a); g(a) }
}

func join2[A, B any](f, g func(A, B)) func(A, B) {
	if f == nil {
		return g
	}
	if g == nil {
		return f
	}
	return func(a A, b B) { f(a, b); g(a, b) }
}

func join3[A, B, C any](f, g func(A, B, C)) func(A, B, C) {
	if f == nil {
		return g
	}
	if g == nil {
		return f
	}
	return func(a A, b B, c C) { f(a, b, c); g(a, b, c) }
}
