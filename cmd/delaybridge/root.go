package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/rabbit"
)

// DefaultMySQLDSN is the local development database that
// scripts/services.sh creates. Only demo and bench fall back to it.
const DefaultMySQLDSN = "delaybridge:delaybridge@tcp(127.0.0.1:3306)/delaybridge?parseTime=true"

// app holds what every subcommand shares: settings and the opened database.
type app struct {
	configFile string
	mysqlDSN   string
	mysqlTLS   tlsFlags
	logLevel   string
	log        *slog.Logger
	stdout     io.Writer
	stderr     io.Writer
}

// newRootCmd builds the command tree. Subcommands are added by the files named
// after them.
func newRootCmd() *cobra.Command {
	return buildRoot(&app{})
}

// buildRoot builds the tree around a, which receives the resolved settings.
func buildRoot(a *app) *cobra.Command {
	a.stdout, a.stderr = os.Stdout, os.Stderr
	root := &cobra.Command{
		Use:   "delaybridge",
		Short: "Reliable delayed tasks on RabbitMQ and RocketMQ, backed by a MySQL outbox",
		Long: `delaybridge makes "do X at time T" reliable on the brokers you already run.

Every flag can also be set with an environment variable named DELAYBRIDGE_
and the flag name in upper case with underscores (--mysql-dsn is
DELAYBRIDGE_MYSQL_DSN), or in the file given by --config, one "name = value"
per line. The command line wins over the environment, which wins over the
file. Each flag that may hold a secret (--mysql-dsn, --amqp-url,
--rocketmq-secret-key) also has a -file twin (--mysql-dsn-file,
DELAYBRIDGE_MYSQL_DSN_FILE) that reads the value from a file, so the secret
stays out of the process list, the environment and the config file. Secrets
are never printed: passwords in DSNs and URLs are redacted in every message.
TLS: --mysql-tls-ca/-cert/-key, --amqp-tls-ca/-cert/-key with an amqps:// URL,
--rocketmq-tls; see SECURITY.md.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			a.stdout, a.stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
			file := a.configFile
			if !cmd.Flags().Changed("config") {
				file = os.Getenv(envName("config"))
			}
			holdsSecret, err := applyConfig(cmd, file)
			if err != nil {
				return err
			}
			if err := applySecretFiles(cmd); err != nil {
				return err
			}
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(a.logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			a.log = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: lvl}))
			if file != "" {
				a.noteConfigFile(file, holdsSecret)
			}
			visitAll(cmd, func(f *pflag.Flag) {
				if strings.HasSuffix(f.Name, fileSuffix) && f.Value.String() != "" {
					if w := secretFileModeWarning(f.Value.String()); w != "" {
						a.log.Warn("delaybridge: secret file "+w, "flag", f.Name)
					}
				}
			})
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.configFile, "config", "", "config file of name = value lines (env DELAYBRIDGE_CONFIG)")
	pf.StringVar(&a.mysqlDSN, "mysql-dsn", "", "MySQL/MariaDB DSN of the outbox database (go-sql-driver format); required, but demo and bench fall back to the local development database")
	pf.StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	a.mysqlTLS.register(pf, "mysql", "the database")
	registerSecretFiles(pf)

	root.AddCommand(newMigrateCmd(a), newStatusCmd(a), newTaskCmd(a), newDeadCmd(a), newRunCmd(a), newDemoCmd(a), newBenchCmd(a), newDoctorCmd(a), newConsoleCmd(a))
	return root
}

// mysqlConfig parses --mysql-dsn and applies the --mysql-tls-* flags.
// parseTime is on unless the DSN says otherwise.
// An empty --mysql-dsn is an error, not the driver's defaults: a daemon
// must not quietly try the development credentials or the driver's
// root@127.0.0.1 against whatever database answers.
func (a *app) mysqlConfig() (*mysql.Config, error) {
	tc, err := a.mysqlTLS.config()
	if err != nil {
		return nil, err
	}
	if a.mysqlDSN == "" {
		return nil, notConfigured("mysql-dsn", "no outbox database configured")
	}
	cfg, err := mysql.ParseDSN(a.mysqlDSN)
	if err != nil {
		return nil, fmt.Errorf("--mysql-dsn %s: %w", redactDSN(a.mysqlDSN), scrub(err, a.mysqlDSN))
	}
	if !strings.Contains(a.mysqlDSN, "parseTime=") {
		cfg.ParseTime = true
	}
	if tc != nil {
		if cfg.TLSConfig != "" {
			return nil, fmt.Errorf("--mysql-tls-* flags and tls=%s in --mysql-dsn: use one", cfg.TLSConfig)
		}
		cfg.TLS = tc
	}
	return cfg, nil
}

// notConfigured is the error for a missing required secret setting: it
// names every way to set it.
func notConfigured(flag, what string) error {
	return fmt.Errorf("%s: set --%s or --%s%s (environment %s or %s, or %s%s in --config); only demo and bench fall back to the local development services",
		what, flag, flag, fileSuffix, envName(flag), envName(flag+fileSuffix), flag, fileSuffix)
}

// useDevDefaults points demo and bench, which exist to try delaybridge on
// the services scripts/services.sh starts, at those services when no
// database or RabbitMQ is configured, and says so.
func (a *app) useDevDefaults(bf *brokerFlags) {
	if a.mysqlDSN == "" {
		a.mysqlDSN = DefaultMySQLDSN
		a.log.Info("delaybridge: no --mysql-dsn set: using the local development database", "database", redactDSN(a.mysqlDSN))
	}
	if bf.kind == "rabbit" && bf.amqpURL == "" {
		bf.amqpURL = DefaultAMQPURL
		a.log.Info("delaybridge: no --amqp-url set: using the local development RabbitMQ", "amqp", rabbit.RedactURL(bf.amqpURL))
	}
}

// openDB opens and pings the outbox database; the password never appears
// in the error.
func (a *app) openDB(ctx context.Context) (*sql.DB, error) {
	cfg, err := a.mysqlConfig()
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", redactDSN(a.mysqlDSN), scrub(err, a.mysqlDSN))
	}
	db := sql.OpenDB(conn)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("database %s: %w", redactDSN(a.mysqlDSN), scrub(err, a.mysqlDSN))
	}
	return db, nil
}

// dbRun adapts fn into a RunE that opens the outbox database for it and
// closes it afterwards.
func (a *app) dbRun(fn func(ctx context.Context, db *sql.DB, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		db, err := a.openDB(cmd.Context())
		if err != nil {
			return err
		}
		defer db.Close()
		return fn(cmd.Context(), db, args)
	}
}

// scrub removes from err's message every secret, and the password inside
// each secret that is a DSN or a URL, in case a driver echoes one. A
// *url.Error is rewritten first: net/url quotes the whole URL with %q, so a
// tab, a quote or a backslash anywhere in it escapes the text replacement,
// and it may quote a piece of a password as a port.
func scrub(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		msg = strings.ReplaceAll(msg, ue.Error(), fmt.Sprintf("%s %q: malformed URL", ue.Op, rabbit.RedactURL(ue.URL)))
	}
	for _, s := range secretParts(secrets) {
		msg = strings.ReplaceAll(msg, s, "(redacted)")
	}
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}

// secretParts returns secrets and the passwords inside them, each also as
// %q would print it, longest first so a whole DSN is replaced before its
// password. A password is taken both from a successful parse and from the
// text's structure (between "://" and the last '@', after the first ':'),
// so a DSN or URL that does not parse still has its password found.
func secretParts(secrets []string) []string {
	var out []string
	add := func(s string) {
		q := strconv.Quote(s)
		for _, v := range []string{s, q[1 : len(q)-1]} {
			if v != "" && !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	for _, s := range secrets {
		add(s)
		add(structuralPassword(s))
		if cfg, err := mysql.ParseDSN(s); err == nil {
			add(cfg.Passwd)
		}
		if u, err := url.Parse(s); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok {
				add(p)
				add(url.QueryEscape(p))
				add(url.PathEscape(p))
			}
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// structuralPassword returns what stands where a DSN's or a URL's password
// would, without parsing: after the first ':' of the text before the last
// '@' (and after "://", if any).
func structuralPassword(s string) string {
	if _, rest, ok := strings.Cut(s, "://"); ok {
		s = rest
	}
	at := strings.LastIndex(s, "@")
	if at < 0 {
		return ""
	}
	_, p, _ := strings.Cut(s[:at], ":")
	return p
}
