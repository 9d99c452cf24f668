package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql" // the outbox's driver
	"github.com/spf13/cobra"
)

// DefaultMySQLDSN is the local development database that
// scripts/services.sh creates.
const DefaultMySQLDSN = "delaybridge:delaybridge@tcp(127.0.0.1:3306)/delaybridge?parseTime=true"

// app holds what every subcommand shares: settings and the opened database.
type app struct {
	configFile string
	mysqlDSN   string
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
file. Passwords in DSNs and URLs are never printed.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			a.stdout, a.stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
			file := a.configFile
			if !cmd.Flags().Changed("config") {
				file = os.Getenv(envName("config"))
			}
			if err := applyConfig(cmd, file); err != nil {
				return err
			}
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(a.logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			a.log = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: lvl}))
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.configFile, "config", "", "config file of name = value lines (env DELAYBRIDGE_CONFIG)")
	pf.StringVar(&a.mysqlDSN, "mysql-dsn", DefaultMySQLDSN, "MySQL/MariaDB DSN of the outbox database (go-sql-driver format)")
	pf.StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn or error")

	root.AddCommand(newMigrateCmd(a), newStatusCmd(a), newTaskCmd(a), newDeadCmd(a), newRunCmd(a), newDemoCmd(a), newBenchCmd(a), newDoctorCmd(a))
	return root
}

// openDB opens and pings the outbox database; the password never appears
// in the error.
func (a *app) openDB(ctx context.Context) (*sql.DB, error) {
	dsn := a.mysqlDSN
	if !strings.Contains(dsn, "parseTime=") {
		if strings.Contains(dsn, "?") {
			dsn += "&parseTime=true"
		} else {
			dsn += "?parseTime=true"
		}
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", redactDSN(a.mysqlDSN), scrub(err, a.mysqlDSN))
	}
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

// scrub removes any secret of dsn that a driver error might echo.
func scrub(err error, secrets ...string) error {
	msg := err.Error()
	for _, s := range secrets {
		if s != "" && strings.Contains(msg, s) {
			msg = strings.ReplaceAll(msg, s, "(redacted)")
		}
	}
	if msg == err.Error() {
		return err
	}
	return fmt.Errorf("%s", msg)
}
