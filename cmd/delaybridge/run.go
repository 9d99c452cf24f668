package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/services"
)

func newRunCmd(a *app) *cobra.Command {
	var (
		bf           brokerFlags
		httpAddr     string
		lookahead    time.Duration
		batch        int
		workers      int
		pace         time.Duration
		grace        time.Duration
		retention    time.Duration
		cleanDuty    float64
		noScan       bool
		noClean      bool
		drain        time.Duration
		pubWait      time.Duration
		maxBytes     int64
		topics       []string
		maxTopics    int
		maxRate      float64
		topicRate    map[string]string
		otlpEndpoint string
		statsEach    time.Duration
		mTopics      int
		shardName    string
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the relay, the scanner and the cleaner, with metrics and health over HTTP",
		Long: `run is the daemon: it publishes pending tasks to the broker (relay), publishes
again what a broker lost or a killed relay left (scanner), deletes finished tasks past their retention
(cleaner), recounts tasks by state and topic for status and /metrics (every
--stats-interval, one daemon at a time), and serves HTTP on --http:

  /metrics  Prometheus metrics: outbox backlog by state and topic, relay publish
            rate and latency, rescues, dead tasks (the consumers' lateness and
            outcomes come from the services that run the handlers:
            delaybridge.Config.Metrics). Labels hold topics and states (and
            shard with --shard-name), never keys, payloads or connection
            settings.
  /healthz  200 while the process runs.
  /readyz   200 when the database answers a ping and the broker accepts a TCP
            connection, 503 otherwise.

It binds to loopback by default; expose it only behind your own access control.
SIGTERM or SIGINT stops taking work, lets the current batches finish or roll
back (up to --drain) and exits 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if shardName != "" && !cli.ValidShardName(shardName) {
				return fmt.Errorf("--shard-name %q: want 1-64 of [A-Za-z0-9_-]", shardName)
			}
			if shardName != "" {
				a.log = a.log.With("shard", shardName)
			}
			if workers < 0 {
				return fmt.Errorf("--relay-workers %d: need 0 (the broker's advice) or more", workers)
			}
			// Every setting is checked before anything connects: bad input
			// changes nothing, not even a queue declared on the broker.
			if err := checkRunFlags(batch, cleanDuty, mTopics, retention, grace, drain, pubWait, statsEach, maxBytes); err != nil {
				return err
			}
			ahead, err := lookaheadSetting(cmd.Flags(), lookahead)
			if err != nil {
				return err
			}
			relayCfg := outbox.RelayConfig{BatchSize: batch, Workers: workers, Lookahead: ahead, Pace: pace,
				PublishTimeout: pubWait, MaxBatchBytes: maxBytes, Topics: topics, MaxTopics: maxTopics, MaxRate: maxRate, Logger: a.log}
			if relayCfg.TopicRates, err = topicRates(topicRate); err != nil {
				return err
			}
			if err := relayCfg.Check(broker.Limits{}); err != nil {
				return fmt.Errorf("relay settings (--lookahead, --relay-*, --publish-timeout): %w", err)
			}
			if httpAddr == "" {
				// net.Listen would take "" for every interface and any port.
				return fmt.Errorf("--http: empty; give the address of the metrics and health endpoint, such as %s (run always serves it)", defaultRunHTTP)
			}
			ln, err := a.listenHTTP(httpAddr)
			if err != nil {
				return err
			}
			defer ln.Close()
			tp, stopTracing, err := startTracing(ctx, otlpEndpoint, "delaybridge", shardName)
			if err != nil {
				return err
			}
			defer func() {
				tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := stopTracing(tctx); err != nil {
					a.log.Warn("delaybridge run: flushing traces failed", "err", err)
				}
			}()
			ses, err := a.openSession(ctx, &bf, false, false)
			if err != nil {
				return err
			}
			defer ses.Close()
			db, cl := ses.DB, ses.Clients
			grace = scanner.Grace(grace, cl.Pub.Limits())
			m := newMetrics(db, grace, a.log)
			m.outbox.maxTopics = mTopics
			m.shard = shardName
			relayCfg.Hooks = outbox.LogProgress(m.RelayHooks(), a.log, 0)
			// The relay records its topology and warns of consumers that use
			// another.
			topo, err := bf.topology(a)
			if err != nil {
				return err
			}
			parts := services.Config{
				Relay:          &relayCfg,
				Cleaner:        &outbox.CleanerConfig{Retention: retention, Duty: cleanDuty, Logger: a.log},
				Stats:          &outbox.StatsRefresherConfig{Interval: statsEach, Grace: grace, Logger: a.log},
				Presence:       &topo,
				PresenceConfig: outbox.PresenceConfig{Logger: a.log},
				Tracing:        broker.NewTracing(tp, bf.Broker),
			}
			if !noScan {
				// A process without a scanner exports no scanner series.
				parts.Scanner = &scanner.Config{Grace: grace, PublishTimeout: pubWait, Hooks: m.ScannerHooks(), Logger: a.log}
			}
			if noClean {
				parts.Cleaner = nil
			}
			if statsEach == 0 {
				parts.Stats = nil
			}
			bg, err := services.New(ctx, db, cl.Pub, parts)
			if err != nil {
				return err
			}
			// Bounded: a database gone at shutdown must not hold the exit
			// past --drain.
			defer bg.Withdraw(context.Background()) //nolint:errcheck // the record expires anyway
			relay := bg.Relay()

			srv := cli.NewHTTPServer(a.httpHandler(m, db, cl.Addr))
			a.log.Info("delaybridge run: started", "broker", bf.Broker, "mode", bf.mode(), "http", ln.Addr().String(),
				"limits_max_hop", cl.Pub.Limits().MaxHop, "limits_precision", cl.Pub.Limits().Precision, "lookahead", relay.Lookahead(), "relay_workers", relay.Workers(), "database", redactDSN(a.mysqlDSN))
			fmt.Fprintf(a.stdout, "delaybridge running: broker %s (%s), http://%s/metrics\n", bf.Broker, bf.mode(), ln.Addr())

			bg.Start()
			defer bg.Stop()
			httpErr := make(chan error, 1)
			go func() { httpErr <- srv.Serve(ln) }()

			var failed error
			select {
			case <-ctx.Done():
				a.log.Info("delaybridge run: stopping")
			case err := <-httpErr:
				// Stops the daemon and exits non-zero, so a supervisor
				// restarts it rather than leave it without health checks.
				failed = fmt.Errorf("http server on %s failed: %w", ln.Addr(), err)
				a.log.Error("delaybridge run: http server failed; stopping", "err", err)
			}
			bg.Stop()
			dctx, cancelDrain := context.WithTimeout(context.Background(), drain)
			defer cancelDrain()
			if bg.Wait(dctx) != nil {
				a.log.Warn("delaybridge run: components still busy after the drain timeout", "drain", drain)
			}
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			fmt.Fprintln(a.stdout, "delaybridge stopped")
			return failed
		},
	}
	f := cmd.Flags()
	bf.registerRelay(f)
	f.StringVar(&httpAddr, "http", defaultRunHTTP, "metrics and health address")
	f.DurationVar(&lookahead, "lookahead", 0, cli.LookaheadHelp)
	f.IntVar(&batch, "batch", outbox.DefaultBatchSize, "rows one relay claim takes")
	f.IntVar(&workers, "relay-workers", 0, cli.RelayWorkersHelp)
	f.DurationVar(&pace, "relay-pace", outbox.DefaultPace, cli.RelayPaceHelp)
	f.DurationVar(&grace, "grace", 0, "how far past due the scanner rescues a task (0 = default)")
	f.DurationVar(&retention, "retention", outbox.DefaultRetention, "keep done and cancelled tasks this long")
	f.Float64Var(&cleanDuty, "cleaner-duty", outbox.DefaultCleanerDuty, "share of time spent deleting (1 = nonstop)")
	f.BoolVar(&noScan, "no-scanner", false, "do not run the scanner in this process")
	f.BoolVar(&noClean, "no-cleaner", false, "do not run the cleaner in this process")
	f.DurationVar(&statsEach, "stats-interval", outbox.DefaultStatsInterval, "how often to recount tasks (0 = never here)")
	f.DurationVar(&drain, "drain", 30*time.Second, "how long shutdown waits for running batches")
	f.DurationVar(&pubWait, "publish-timeout", outbox.DefaultPublishTimeout, "time limit of one batch's publish")
	f.IntVar(&mTopics, "metrics-topics", maxTopicSeries, "topics named on /metrics; more are \"(other)\"")
	f.StringVar(&shardName, "shard-name", "", "outbox shard this daemon serves, labels logs and metrics")
	f.Int64Var(&maxBytes, "relay-batch-bytes", outbox.DefaultMaxBatchBytes, "payload bytes one claim holds at most")
	f.StringSliceVar(&topics, "relay-topics", nil, "the only topics relayed (default: any); others go dead")
	f.IntVar(&maxTopics, "relay-max-topics", outbox.DefaultMaxTopics, "most topics relayed; more go dead (-1 = any)")
	f.Float64Var(&maxRate, "relay-max-rate", 0, "most rows relayed a second, the bound of a backlog's drain (0 = none)")
	f.StringToStringVar(&topicRate, "relay-topic-rate", nil, "most rows of a topic relayed a second, as topic=rate (repeatable)")
	f.StringVar(&otlpEndpoint, "otlp-endpoint", "", "OTLP/HTTP collector that receives traces, such as http://localhost:4318")
	return cmd
}

// topicRates reads --relay-topic-rate's topic=rate pairs.
func topicRates(in map[string]string) (map[string]float64, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make(map[string]float64, len(in))
	for t, v := range in {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("--relay-topic-rate %s=%s: want a rate above 0, rows a second", t, v)
		}
		if err := broker.ValidateTopic(t); err != nil {
			return nil, fmt.Errorf("--relay-topic-rate %s=%s: %w", t, v, err)
		}
		out[t] = f
	}
	return out, nil
}

// defaultRunHTTP is run's --http: loopback only.
const defaultRunHTTP = "127.0.0.1:9464"

// checkRunFlags refuses run's numeric settings that mean nothing, rather
// than let a default stand in for them unannounced.
func checkRunFlags(batch int, cleanDuty float64, mTopics int, retention, grace, drain, pubWait, statsEach time.Duration, maxBytes int64) error {
	var bad []string
	if batch < 1 {
		bad = append(bad, fmt.Sprintf("--batch %d: want 1 or more", batch))
	}
	if !(cleanDuty > 0 && cleanDuty <= 1) { // NaN fails both
		bad = append(bad, fmt.Sprintf("--cleaner-duty %v: want more than 0 and at most 1", cleanDuty))
	}
	if mTopics < 1 {
		bad = append(bad, fmt.Sprintf("--metrics-topics %d: want 1 or more", mTopics))
	}
	if retention <= 0 {
		bad = append(bad, fmt.Sprintf("--retention %v: want a positive duration (--no-cleaner keeps every task)", retention))
	}
	if grace < 0 {
		bad = append(bad, fmt.Sprintf("--grace %v: want 0 (the default) or more", grace))
	}
	if drain < 0 {
		bad = append(bad, fmt.Sprintf("--drain %v: want 0 (do not wait) or more", drain))
	}
	if pubWait <= 0 {
		bad = append(bad, fmt.Sprintf("--publish-timeout %v: want a positive duration", pubWait))
	}
	if statsEach < 0 {
		bad = append(bad, fmt.Sprintf("--stats-interval %v: want 0 (never in this process) or more", statsEach))
	}
	if maxBytes < 1 {
		bad = append(bad, fmt.Sprintf("--relay-batch-bytes %d: want 1 or more", maxBytes))
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "; "))
	}
	return nil
}

// listenMetrics listens on addr for serveMetricsOn, nil for an empty addr:
// demo and bench listen before they touch the database, so a bad --http
// changes nothing.
func (a *app) listenMetrics(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	return a.listenHTTP(addr)
}

// serveMetricsOn serves m on ln (nothing when ln is nil) until the
// returned stop is called.
func (a *app) serveMetricsOn(ln net.Listener, m *metrics, db *sql.DB, brokerAddr string) (stop func()) {
	if ln == nil {
		return func() {}
	}
	srv := cli.NewHTTPServer(a.httpHandler(m, db, brokerAddr))
	go func() { _ = srv.Serve(ln) }()
	fmt.Fprintf(a.stderr, "metrics on http://%s/metrics\n", ln.Addr())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}

// httpHandler serves metrics and health.
func (a *app) httpHandler(m *metrics, db *sql.DB, brokerAddr string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(shardGatherer(m.reg, m.shard), promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		var problems []error
		if err := db.PingContext(ctx); err != nil {
			problems = append(problems, fmt.Errorf("database: %w", scrub(err, a.mysqlDSN)))
		}
		if brokerAddr != "" {
			d := net.Dialer{Timeout: 3 * time.Second}
			if c, err := d.DialContext(ctx, "tcp", brokerAddr); err != nil {
				problems = append(problems, fmt.Errorf("broker %s: %w", brokerAddr, err))
			} else {
				c.Close()
			}
		}
		if err := errors.Join(problems...); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// lookaheadSetting turns --lookahead into RelayConfig.Lookahead: unset is
// the broker's advice (0), an explicit 0 every pending task at once (-1).
func lookaheadSetting(fs *pflag.FlagSet, v time.Duration) (time.Duration, error) {
	switch {
	case v < 0:
		return 0, fmt.Errorf("--lookahead must not be negative, not %v", v)
	case !fs.Changed("lookahead"):
		return 0, nil
	case v == 0:
		return -1, nil
	}
	return v, nil
}
