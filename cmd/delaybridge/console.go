package main

import (
	"context"
	"crypto/tls"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/outbox"
)

//go:embed console/*.html console/*.css
var consoleFiles embed.FS

// consoleOptions are the console's settings besides the database and the
// broker.
type consoleOptions struct {
	listen     string
	authFile   string
	readOnly   bool
	tlsCert    string
	tlsKey     string
	allowPlain bool
	grace      time.Duration
	probe      time.Duration
}

func newConsoleCmd(a *app) *cobra.Command {
	var (
		bf   brokerFlags
		sf   shardFlags
		opts consoleOptions
	)
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the operator's console: backlog, tasks, dead tasks and broker limits in a browser",
		Long: `console serves a web console over the outbox database and the broker
settings (the same --mysql-dsn and broker flags as run and doctor):

  /          overview: backlog by state and topic, tasks coming due over the
             next hour, lateness over the last hour, oldest pending, rescues,
             overdue and dead counts
  /tasks     search by topic and key prefix, filter by state and due window
  /tasks/ID  one task's timeline; cancel, reschedule, replay
  /dead      dead tasks with their errors; replay one or many
  /brokers   the delay limits in effect and doctor's checks

With --shard NAME=DSN (repeated, as for status and doctor) it serves every
outbox shard: the overview shows each shard under its name, plus totals, and
a shard that cannot be read as down with its error; search, a task's page,
its actions and the dead list work on the shard named by ?shard=NAME.

Every request needs the user:password held in --auth-file (HTTP basic auth).
Actions are POSTs that carry a CSRF token, are refused from other origins,
ask for a confirmation first and are logged with who made them; --read-only
refuses them all. Keys and payloads are hidden unless revealed on a task's
page, and each reveal is logged. The console listens on loopback by default;
another address needs --tls-cert and --tls-key, or --allow-plain-http.
See docs/console.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The durations are checked before anything is opened: bad
			// input changes nothing.
			if opts.grace < 0 {
				return fmt.Errorf("--grace %v: want 0 (overdue as soon as past due) or more", opts.grace)
			}
			if err := checkProbeDelay(opts.probe); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cred, err := readConsoleCredential(opts.authFile)
			if err != nil {
				return err
			}
			if (opts.tlsCert == "") != (opts.tlsKey == "") {
				return errors.New("--tls-cert and --tls-key go together")
			}
			// The key pair is loaded before anything listens or says it
			// serves: a file that cannot be read is an error here, naming
			// the flags, not after "console on https://…".
			tlsCfg, err := consoleTLS(opts)
			if err != nil {
				return err
			}
			// The broker settings feed the brokers page only: without them
			// the console still serves the outbox, and that page says what
			// is missing.
			if err := bf.check(a); err != nil {
				a.log.Warn("delaybridge console: the brokers page cannot show limits", "err", err)
			}
			shards, err := a.openConsoleShards(ctx, &sf)
			if err != nil {
				return err
			}
			defer closeShards(shards)
			if err := checkConsoleSchemas(ctx, a, shards); err != nil {
				return err
			}
			c, err := newConsole(a, shards, &bf, &sf, cred, opts)
			if err != nil {
				return err
			}
			defer c.Close()
			ln, err := c.listen(opts)
			if err != nil {
				return err
			}
			srv := newHTTPServer(c.Handler())
			srv.TLSConfig = tlsCfg
			scheme := "http"
			if tlsCfg != nil {
				scheme = "https"
			}
			a.log.Info("delaybridge console: started", "listen", ln.Addr().String(), "read_only", opts.readOnly, "user", cred.user)
			fmt.Fprintf(a.stdout, "delaybridge console on %s://%s/\n", scheme, ln.Addr())
			serveErr := make(chan error, 1)
			go func() {
				if tlsCfg != nil {
					// The certificate is srv.TLSConfig's, loaded above.
					serveErr <- srv.ServeTLS(ln, "", "")
				} else {
					serveErr <- srv.Serve(ln)
				}
			}()
			select {
			case <-ctx.Done():
			case err := <-serveErr:
				return fmt.Errorf("console: %w", err)
			}
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			return nil
		},
	}
	f := cmd.Flags()
	bf.register(f)
	sf.register(f)
	f.StringVar(&opts.listen, "listen", "127.0.0.1:9465", "address the console listens on; beyond loopback it needs --tls-cert/--tls-key or --allow-plain-http")
	f.StringVar(&opts.authFile, "auth-file", "", "file holding the console's credential as user:password on one line (password at least 16 characters); required")
	f.BoolVar(&opts.readOnly, "read-only", false, "show everything, change nothing: refuse cancel, reschedule and replay")
	f.StringVar(&opts.tlsCert, "tls-cert", "", "PEM certificate (chain) to serve the console over HTTPS, with --tls-key")
	f.StringVar(&opts.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	f.BoolVar(&opts.allowPlain, "allow-plain-http", false, "allow a --listen address beyond loopback without TLS (the password then crosses the network in the clear)")
	f.DurationVar(&opts.grace, "grace", 30*time.Second, "how far past due a published task counts as overdue (0 or more)")
	f.DurationVar(&opts.probe, "probe-delay", 2*time.Second, "delay of doctor's RocketMQ precision probe when the brokers page runs the checks (more than 0)")
	return cmd
}

// checkConsoleSchemas refuses to serve a database that lacks a migration
// this binary ships, as run does (outbox.CheckSchema): its pages would
// fail with 500s, and its actions would change a schema they do not know.
// A --shard that does not answer at start is left to be shown as down
// (openConsoleShards logged it); one that answers is checked like the
// single database.
func checkConsoleSchemas(ctx context.Context, a *app, shards []*consoleShard) error {
	for _, sh := range shards {
		cctx, cancel := context.WithTimeout(ctx, shardPingTimeout)
		err := outbox.CheckSchema(cctx, sh.db)
		if err != nil && sh.name != "" && sh.db.PingContext(cctx) != nil {
			err = nil
		}
		cancel()
		if err == nil {
			continue
		}
		// As run's: the server's answer, which holds no DSN to scrub.
		if sh.name != "" {
			return fmt.Errorf("--shard %s: %w", sh.name, err)
		}
		return fmt.Errorf("database %s: %w", redactDSN(sh.dsn), err)
	}
	return nil
}

// consoleTLS loads --tls-cert and --tls-key into the console's server TLS
// configuration, nil without them.
func consoleTLS(opts consoleOptions) (*tls.Config, error) {
	if opts.tlsCert == "" {
		return nil, nil
	}
	pair, err := tls.LoadX509KeyPair(opts.tlsCert, opts.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s / --tls-key %s: %w", opts.tlsCert, opts.tlsKey, err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}, nil
}

// console is the operator's web console over one outbox database, or over
// the databases of every outbox shard.
type console struct {
	a        *app
	shards   []*consoleShard
	bf       *brokerFlags
	sf       *shardFlags
	cred     consoleCredential
	csrf     *csrf
	log      *slog.Logger
	readOnly bool
	grace    time.Duration
	probe    time.Duration
	now      func() time.Time
	pages    map[string]*template.Template
	logins   *loginThrottle // nil: guard makes one

	// doctor holds the last run of doctor's checks; runs owns the
	// goroutine of one in progress, which Close stops and waits for.
	mu     sync.Mutex
	doctor doctorRun
	runs   sync.WaitGroup
	ctx    context.Context
	stop   context.CancelFunc
}

// doctorRun is one run of doctor's checks from the brokers page.
type doctorRun struct {
	Running  bool
	By       string
	Started  time.Time
	Finished time.Time
	Checks   []doctorCheck
	Failed   int
	Warned   int
}

// newConsole serves shards: one unnamed shard for an unsharded outbox, or
// every --shard, each named. sf is what the brokers page hands doctor.
func newConsole(a *app, shards []*consoleShard, bf *brokerFlags, sf *shardFlags, cred consoleCredential, opts consoleOptions) (*console, error) {
	if len(shards) == 0 {
		return nil, errors.New("console: no outbox database")
	}
	if len(shards) > 1 || shards[0].name != "" {
		for _, sh := range shards {
			if !validShardName(sh.name) {
				return nil, fmt.Errorf("console: shard name %q: want 1-64 of [A-Za-z0-9_-]", sh.name)
			}
		}
	}
	cs, err := newCSRF(time.Now)
	if err != nil {
		return nil, err
	}
	pages, err := parseConsolePages()
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	return &console{a: a, shards: shards, bf: bf, sf: sf, cred: cred, csrf: cs, log: a.log, readOnly: opts.readOnly, grace: opts.grace, probe: opts.probe,
		now: time.Now, pages: pages, ctx: ctx, stop: stop}, nil
}

// Close stops a doctor run in progress and waits for it.
func (c *console) Close() {
	c.stop()
	c.runs.Wait()
}

// listen opens the console's address: loopback, or beyond it only with TLS
// or --allow-plain-http; at most httpMaxConns connections at once.
func (c *console) listen(opts consoleOptions) (net.Listener, error) {
	ln, err := net.Listen("tcp", opts.listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %s: %w", opts.listen, err)
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		switch {
		case opts.tlsCert != "":
		case opts.allowPlain:
			c.log.Warn("delaybridge console: listening beyond loopback without TLS: the password crosses the network in the clear", "listen", ln.Addr().String())
		default:
			ln.Close()
			return nil, fmt.Errorf("--listen %s is reachable beyond this host: serve TLS (--tls-cert, --tls-key) or pass --allow-plain-http", opts.listen)
		}
	}
	return newLimitListener(ln, httpMaxConns), nil
}

// Handler serves the console, every route behind guard.
func (c *console) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /tasks", c.tasks)
	mux.HandleFunc("GET /tasks/{id}", c.task)
	mux.HandleFunc("POST /tasks/{id}/{action}", c.taskAction)
	mux.HandleFunc("GET /dead", c.dead)
	mux.HandleFunc("POST /dead/replay", c.deadReplay)
	mux.HandleFunc("GET /brokers", c.brokers)
	mux.HandleFunc("POST /brokers/check", c.brokersCheck)
	mux.HandleFunc("GET /static/style.css", func(w http.ResponseWriter, r *http.Request) {
		f, err := consoleFiles.Open("console/style.css")
		if err != nil {
			http.NotFound(w, r)
			return
		}
		defer f.Close()
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		_, _ = io.Copy(w, f)
	})
	return c.guard(mux)
}

// startDoctor runs doctor's checks in the background unless a run is in
// progress, and reports whether it started one.
func (c *console) startDoctor(by string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.doctor.Running {
		return false
	}
	c.doctor = doctorRun{Running: true, By: by, Started: c.now()}
	c.runs.Add(1)
	go func() {
		defer c.runs.Done()
		ctx, cancel := context.WithTimeout(c.ctx, c.probe+2*time.Minute)
		defer cancel()
		// A copy of the app whose output goes nowhere: the report keeps
		// the checks, and the console shows them.
		quiet := *c.a
		quiet.stdout = io.Discard
		r := runDoctor(ctx, &quiet, c.bf, c.sf, c.probe)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.doctor.Running, c.doctor.Finished = false, c.now()
		c.doctor.Checks, c.doctor.Failed, c.doctor.Warned = r.checks, r.failed, r.warned
		c.log.Info("console: doctor finished", "by", by, "failed", r.failed, "warnings", r.warned)
	}()
	return true
}

func (c *console) lastDoctor() doctorRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.doctor
}
