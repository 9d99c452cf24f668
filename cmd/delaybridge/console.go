package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/console"
)

func newConsoleCmd(a *app) *cobra.Command {
	var (
		bf   brokerFlags
		sf   shardFlags
		opts console.Options
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
			return console.Serve(cmd.Context(), a.consoleEnv(&bf, &sf), opts)
		},
	}
	f := cmd.Flags()
	bf.register(f)
	sf.register(f)
	opts.Register(f)
	return cmd
}

// consoleEnv is what the console takes from the other commands: the broker
// flags bf, the databases of --mysql-dsn or sf's shards, and doctor's
// checks.
func (a *app) consoleEnv(bf *brokerFlags, sf *shardFlags) console.Env {
	return console.Env{
		Log:         a.log,
		Stdout:      a.stdout,
		Broker:      bf.Settings,
		DSN:         a.mysqlDSN,
		CheckBroker: func() error { return bf.check(a) },
		OpenShards:  func(ctx context.Context) ([]*console.Shard, error) { return a.openConsoleShards(ctx, sf) },
		Doctor: func(ctx context.Context, probe time.Duration) console.DoctorReport {
			// A copy of the app whose output goes nowhere: the report keeps
			// the checks, and the console shows them.
			quiet := *a
			quiet.stdout = io.Discard
			r := runDoctor(ctx, &quiet, bf, sf, probe)
			out := console.DoctorReport{Failed: r.failed, Warned: r.warned}
			for _, c := range r.checks {
				out.Checks = append(out.Checks, console.Check(c))
			}
			return out
		},
	}
}

// openConsoleShards opens the databases the console serves: --mysql-dsn
// when no --shard is given, which must answer at start as for every other
// command; else every --shard, each a pool that connects when used (the
// console logs a shard that does not answer at start, and shows it as
// down until it answers).
func (a *app) openConsoleShards(ctx context.Context, sf *shardFlags) ([]*console.Shard, error) {
	parsed, err := sf.parse()
	if err != nil {
		return nil, err
	}
	if len(parsed) == 0 {
		db, err := a.openDB(ctx)
		if err != nil {
			return nil, err
		}
		return []*console.Shard{console.NewShard("", a.mysqlDSN, db)}, nil
	}
	if a.mysqlDSN != "" {
		return nil, fmt.Errorf("--mysql-dsn and --shard are both set (flag, %s or config file): give every outbox as a --shard", envName("mysql-dsn"))
	}
	// mysqlConfig reads a.mysqlDSN: point it at each shard in turn, so the
	// --mysql-tls-* flags apply to every shard as they do for status.
	defer func() { a.mysqlDSN = "" }()
	var out []*console.Shard
	for _, p := range parsed {
		a.mysqlDSN = p.dsn
		db, err := openPool(a)
		if err != nil {
			console.CloseShards(out)
			return nil, fmt.Errorf("--shard %s: %w", p.name, scrub(err, p.dsn))
		}
		out = append(out, console.NewShard(p.name, p.dsn, db))
	}
	return out, nil
}

// openPool opens a pool on a.mysqlDSN without connecting.
func openPool(a *app) (*sql.DB, error) {
	cfg, err := a.mysqlConfig()
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(conn), nil
}
