package console

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

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/driver"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/redact"
)

//go:embed web/*.html web/*.css
var webFiles embed.FS

// Options are the console's settings besides the database and the
// broker.
type Options struct {
	listen     string
	authFile   string
	readOnly   bool
	tlsCert    string
	tlsKey     string
	allowPlain bool
	grace      time.Duration
	probe      time.Duration
}

// Register adds the console's own flags to f.
func (opts *Options) Register(f *pflag.FlagSet) {
	f.StringVar(&opts.listen, "listen", "127.0.0.1:9465", "address to listen on; beyond loopback it needs TLS or --allow-plain-http")
	f.StringVar(&opts.authFile, "auth-file", "", "file holding the console's user:password on one line (required)")
	f.BoolVar(&opts.readOnly, "read-only", false, "show everything, change nothing: refuse cancel, reschedule and replay")
	f.StringVar(&opts.tlsCert, "tls-cert", "", "PEM certificate (chain) to serve the console over HTTPS, with --tls-key")
	f.StringVar(&opts.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	f.BoolVar(&opts.allowPlain, "allow-plain-http", false, "allow --listen beyond loopback without TLS (the password then crosses the network in the clear)")
	f.DurationVar(&opts.grace, "grace", 30*time.Second, "how far past due a published task counts as overdue (0 or more)")
	f.DurationVar(&opts.probe, "probe-delay", 2*time.Second, "delay of the brokers page's RocketMQ precision probe (more than 0)")
}

// Env is what the console takes from the binary around it: where it logs
// and prints, the broker settings, and the parts of other commands it
// uses. Every field is required.
type Env struct {
	Log    *slog.Logger
	Stdout io.Writer
	// Broker is the broker part of the settings (--broker and the rest),
	// with Log as its logger: the brokers page shows its limits, a task's
	// page plans its hops with them.
	Broker driver.Settings
	// DSN is --mysql-dsn, which no error may show.
	DSN string
	// CheckBroker checks the broker settings without connecting. Bad ones
	// only cost the brokers page its limits.
	CheckBroker func() error
	// OpenShards opens the outbox databases to serve: one unnamed, or
	// every --shard by name.
	OpenShards func(ctx context.Context) ([]*Shard, error)
	// Doctor runs doctor's checks of the database and the broker, with a
	// delay of probe for the RocketMQ precision probe.
	Doctor func(ctx context.Context, probe time.Duration) DoctorReport
}

// DoctorReport is the outcome of one run of doctor's checks.
type DoctorReport struct {
	Checks []Check
	Failed int
	Warned int
}

// Check is one of doctor's findings: OK, WARN or FAIL and what it says.
type Check struct {
	Level string
	Text  string
}

// Serve serves the console until ctx ends or SIGINT or SIGTERM arrives.
func Serve(ctx context.Context, env Env, opts Options) error {
	// The durations are checked before anything is opened: bad
	// input changes nothing.
	if opts.grace < 0 {
		return fmt.Errorf("--grace %v: want 0 (overdue as soon as past due) or more", opts.grace)
	}
	if err := cli.CheckProbeDelay(opts.probe); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cred, err := readCredential(opts.authFile)
	if err != nil {
		return err
	}
	if (opts.tlsCert == "") != (opts.tlsKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	// The key pair is loaded before anything listens or says it
	// serves: a file that cannot be read is an error here, naming
	// the flags, not after "console on https://…".
	tlsCfg, err := loadTLS(opts)
	if err != nil {
		return err
	}
	// The broker settings feed the brokers page only: without them
	// the console still serves the outbox, and that page says what
	// is missing.
	if err := env.CheckBroker(); err != nil {
		env.Log.Warn("delaybridge console: the brokers page cannot show limits", "err", err)
	}
	shards, err := env.OpenShards(ctx)
	if err != nil {
		return err
	}
	defer CloseShards(shards)
	pingShards(ctx, env.Log, shards)
	if err := checkSchemas(ctx, shards); err != nil {
		return err
	}
	c, err := newConsole(env, shards, cred, opts)
	if err != nil {
		return err
	}
	defer c.Close()
	ln, err := c.listen(opts)
	if err != nil {
		return err
	}
	srv := cli.NewHTTPServer(c.Handler())
	srv.TLSConfig = tlsCfg
	scheme := "http"
	if tlsCfg != nil {
		scheme = "https"
	}
	env.Log.Info("delaybridge console: started", "listen", ln.Addr().String(), "read_only", opts.readOnly, "user", cred.user)
	fmt.Fprintf(env.Stdout, "delaybridge console on %s://%s/\n", scheme, ln.Addr())
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
}

// checkSchemas refuses to serve a database that lacks a migration
// this binary ships, as run does (outbox.CheckSchema): its pages would
// fail with 500s, and its actions would change a schema they do not know.
// A --shard that does not answer at start is left to be shown as down
// (pingShards logged it); one that answers is checked like the
// single database.
func checkSchemas(ctx context.Context, shards []*Shard) error {
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
		return fmt.Errorf("database %s: %w", redact.DSN(sh.dsn), err)
	}
	return nil
}

// loadTLS loads --tls-cert and --tls-key into the console's server TLS
// configuration, nil without them.
func loadTLS(opts Options) (*tls.Config, error) {
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
	env      Env
	shards   []*Shard
	cred     credential
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
	Checks   []Check
	Failed   int
	Warned   int
}

// newConsole serves shards: one unnamed shard for an unsharded outbox, or
// every --shard, each named.
func newConsole(env Env, shards []*Shard, cred credential, opts Options) (*console, error) {
	if len(shards) == 0 {
		return nil, errors.New("console: no outbox database")
	}
	if len(shards) > 1 || shards[0].name != "" {
		for _, sh := range shards {
			if !cli.ValidShardName(sh.name) {
				return nil, fmt.Errorf("console: shard name %q: want 1-64 of [A-Za-z0-9_-]", sh.name)
			}
		}
	}
	cs, err := newCSRF(time.Now)
	if err != nil {
		return nil, err
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	return &console{env: env, shards: shards, cred: cred, csrf: cs, log: env.Log, readOnly: opts.readOnly, grace: opts.grace, probe: opts.probe,
		now: time.Now, pages: pages, ctx: ctx, stop: stop}, nil
}

// Close stops a doctor run in progress and waits for it.
func (c *console) Close() {
	c.stop()
	c.runs.Wait()
}

// listen opens the console's address: loopback, or beyond it only with TLS
// or --allow-plain-http; at most cli.HTTPMaxConns connections at once.
func (c *console) listen(opts Options) (net.Listener, error) {
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
	return cli.NewLimitListener(ln, cli.HTTPMaxConns), nil
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
		f, err := webFiles.Open("web/style.css")
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
		r := c.env.Doctor(ctx, c.probe)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.doctor.Running, c.doctor.Finished = false, c.now()
		c.doctor.Checks, c.doctor.Failed, c.doctor.Warned = r.Checks, r.Failed, r.Warned
		c.log.Info("console: doctor finished", "by", by, "failed", r.Failed, "warnings", r.Warned)
	}()
	return true
}

func (c *console) lastDoctor() doctorRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.doctor
}
