package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/redact"
	"github.com/delaybridge/delaybridge/internal/settings"
)

// DefaultMySQLDSN is the local development database that
// scripts/services.sh creates. Only demo and bench fall back to it.
const DefaultMySQLDSN = "delaybridge:delaybridge@tcp(127.0.0.1:3306)/delaybridge?parseTime=true"

// app holds what every subcommand shares: settings and the opened database.
type app struct {
	configFile string
	mysqlDSN   string
	mysqlTLS   delaybridge.TLSFiles
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
--rocketmq-secret-key, --signing-keys) also has a -file twin (--mysql-dsn-file,
DELAYBRIDGE_MYSQL_DSN_FILE) that reads the value from a file, so the secret
stays out of the process list, the environment and the config file. Secrets
are never printed: passwords in DSNs and URLs are redacted in every message.
TLS: --mysql-tls-ca/-cert/-key/-server-name, --amqp-tls-ca/-cert/-key/-server-name
with an amqps:// URL, --rocketmq-tls; see SECURITY.md. Each flag's help is
one line; docs/flags.md says what the line leaves out.`,
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
			lvl, err := parseLogLevel(a.logLevel)
			if err != nil {
				return err
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
				// --shard NAME=@FILE reads a DSN, a secret, from FILE.
				if sv, ok := f.Value.(pflag.SliceValue); ok && f.Name == "shard" {
					for _, v := range sv.GetSlice() {
						if _, file, ok := strings.Cut(v, "=@"); ok && file != "" {
							if w := secretFileModeWarning(file); w != "" {
								a.log.Warn("delaybridge: secret file "+w, "flag", f.Name)
							}
						}
					}
				}
			})
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.configFile, "config", "", "config file of name = value lines (env DELAYBRIDGE_CONFIG)")
	settings.RegisterDatabaseFlags(pf, &a.mysqlDSN, a.mysqlTLS.Register)
	pf.StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	registerSecretFiles(pf)

	root.AddCommand(newMigrateCmd(a), newStatusCmd(a), newTaskCmd(a), newDeadCmd(a), newRunCmd(a), newDemoCmd(a), newBenchCmd(a), newSoakCmd(a), newDoctorCmd(a), newConsoleCmd(a))
	// Added now rather than by Execute, so requireSubcommand sees it too.
	root.InitDefaultCompletionCmd()
	requireSubcommand(root)
	refuseUnknownHelpTopics(root)
	return root
}

// parseLogLevel reads --log-level: debug, info, warn or error, in any case
// (slog's offsets such as warn+2 work too).
func parseLogLevel(s string) (slog.Level, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return lvl, nil
}

// requireSubcommand makes every command under root that only groups others
// (task, dead, completion) refuse an argument that names none of them:
// cobra prints such a group's help and exits 0 on any arguments, so
// "delaybridge task canel T K" in a script looked like success. Alone, a
// group still prints its help. The root command itself refuses an unknown
// command already.
func requireSubcommand(root *cobra.Command) {
	for _, c := range root.Commands() {
		if c.HasSubCommands() && !c.Runnable() {
			c.Args = unknownSubcommand
			c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
		}
		requireSubcommand(c)
	}
}

// refuseUnknownHelpTopics makes "delaybridge help TOPIC" fail for a TOPIC
// that is no command: cobra's help command prints "Unknown help topic" and
// exits 0, which a script takes for success.
func refuseUnknownHelpTopics(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	for _, c := range root.Commands() {
		if c.Name() != "help" || c.Run == nil {
			continue
		}
		show := c.Run
		c.Run = nil
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				target, rest, err := root.Find(args)
				if err != nil || target == nil || len(rest) > 0 || target == root {
					return fmt.Errorf("unknown help topic %q (see %s --help for the commands)", strings.Join(args, " "), root.Name())
				}
			}
			show(cmd, args)
			return nil
		}
	}
}

// unknownSubcommand refuses the arguments of a group command, naming the
// first and the subcommands it is close to, as cobra does for the root.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2
	}
	hint := ""
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		hint = "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return fmt.Errorf("unknown command %q for %q%s (see %s --help)", args[0], cmd.CommandPath(), hint, cmd.CommandPath())
}

// dbConfig is the database part of the settings.
func (a *app) dbConfig() delaybridge.Config {
	return delaybridge.Config{MySQLDSN: a.mysqlDSN, MySQLTLS: a.mysqlTLS}
}

// mysqlConfig parses --mysql-dsn and applies the --mysql-tls-* flags (see
// delaybridge.Config.MySQLConfig).
func (a *app) mysqlConfig() (*mysql.Config, error) { return a.dbConfig().MySQLConfig() }

// useDevDefaults points demo and bench, which exist to try delaybridge on
// the services scripts/services.sh starts, at those services when no
// database or RabbitMQ is configured, and says so.
func (a *app) useDevDefaults(bf *brokerFlags) {
	if a.mysqlDSN == "" {
		a.mysqlDSN = DefaultMySQLDSN
		a.log.Info("delaybridge: no --mysql-dsn set: using the local development database", "database", redactDSN(a.mysqlDSN))
	}
	if bf.Broker == "rabbit" && bf.AMQPURL == "" {
		bf.AMQPURL = DefaultAMQPURL
		a.log.Info("delaybridge: no --amqp-url set: using the local development RabbitMQ", "amqp", rabbit.RedactURL(bf.AMQPURL))
	}
}

// openDB opens and pings the outbox database; the password never appears
// in the error.
func (a *app) openDB(ctx context.Context) (*sql.DB, error) { return a.dbConfig().OpenDB(ctx) }

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

// outboxRun is dbRun for the commands that read or change tasks (task,
// dead). Their statements fail on a database that lacks the schema with
// the server's "Table ... doesn't exist"; that error becomes
// outbox.CheckSchema's, which names the missing migrations and says to
// run delaybridge migrate, as status, doctor and run do. The schema is
// read only after such a failure: the usual path costs no extra query.
func (a *app) outboxRun(fn func(ctx context.Context, db *sql.DB, args []string) error) func(*cobra.Command, []string) error {
	return a.dbRun(func(ctx context.Context, db *sql.DB, args []string) error {
		err := fn(ctx, db, args)
		if !schemaError(err) {
			return err
		}
		if serr := outbox.CheckSchema(ctx, db); errors.Is(serr, outbox.ErrSchemaBehind) {
			return serr
		}
		return err
	})
}

// schemaError reports whether err is the server's refusal of a table or a
// column the database does not have (MySQL errors 1146 and 1054).
func schemaError(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1146 || me.Number == 1054)
}

// scrub removes every secret from err's message (see redact.Scrub).
func scrub(err error, secrets ...string) error { return redact.Scrub(err, secrets...) }
