package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/settings"
)

// A sharded order database keeps one outbox per shard. delaybridge runs one
// daemon per shard (`run --shard-name NAME --mysql-dsn DSN`): a dead or slow
// shard then stalls only its own daemon, and each daemon is the unsharded
// one, unchanged. status and doctor read every shard in one command
// (--shard NAME=DSN, repeated) and name the shard on every line they print;
// the console serves every shard (console_shard.go). docs/deployment.md
// describes the shape.

// shard is one outbox database and the name it is reported under.
type shard struct {
	name string
	dsn  string
}

// shardFlags is the repeatable --shard NAME=DSN of status, doctor and
// console.
type shardFlags struct {
	raw []string
}

func (s *shardFlags) register(f *pflag.FlagSet) {
	f.StringArrayVar(&s.raw, "shard", nil, "an outbox shard NAME=DSN or NAME=@FILE, repeatable")
}

// parse validates every --shard: a legal, unique name and a non-empty DSN
// the driver parses. Errors never show a password.
func (s *shardFlags) parse() ([]shard, error) {
	out := make([]shard, 0, len(s.raw))
	for _, raw := range s.raw {
		name, dsn, ok := strings.Cut(raw, "=")
		if !ok || !cli.ValidShardName(name) {
			return nil, fmt.Errorf("--shard: want NAME=DSN or NAME=@FILE, NAME being 1-64 of [A-Za-z0-9_-]; got a value starting %q", shardPrefix(raw))
		}
		if slices.ContainsFunc(out, func(o shard) bool { return o.name == name }) {
			return nil, fmt.Errorf("--shard %s given twice", name)
		}
		if file, ok := strings.CutPrefix(dsn, "@"); ok {
			v, err := readSecretFile(file)
			if err != nil {
				return nil, fmt.Errorf("--shard %s: %w", name, err)
			}
			dsn = v
		}
		// The driver parses an empty DSN, and openDB would then ask for
		// --mysql-dsn, which --shard replaces: name the shard instead.
		if strings.TrimSpace(dsn) == "" {
			return nil, fmt.Errorf("--shard %s: empty DSN: want NAME=DSN or NAME=@FILE", name)
		}
		if _, err := mysql.ParseDSN(dsn); err != nil {
			return nil, fmt.Errorf("--shard %s: DSN %s: %w; %s", name, redactDSN(dsn), scrub(err, dsn), settings.DSNFormHint(dsn))
		}
		out = append(out, shard{name: name, dsn: dsn})
	}
	return out, nil
}

// shardPrefix is the part of a malformed --shard value safe to print: at
// most the text before any ':' (where a password would start) and 20 bytes.
func shardPrefix(raw string) string {
	raw, _, _ = strings.Cut(raw, ":")
	if len(raw) > 20 {
		raw = raw[:20]
	}
	return raw
}

// eachShard runs fn once per shard with a.mysqlDSN pointing at it, so the
// usual openDB, TLS flags and error scrubbing apply, and restores it after.
// Without --shard it runs fn once, unnamed, on --mysql-dsn. It runs every
// shard even when one fails, and returns the failures joined, each naming
// its shard.
func (a *app) eachShard(ctx context.Context, sf *shardFlags, fn func(ctx context.Context, name string) error) error {
	shards, err := sf.parse()
	if err != nil {
		return err
	}
	if len(shards) == 0 {
		return fn(ctx, "")
	}
	if a.mysqlDSN != "" {
		return fmt.Errorf("--mysql-dsn and --shard are both set (flag, %s or config file): give every outbox as a --shard", envName("mysql-dsn"))
	}
	defer func() { a.mysqlDSN = "" }()
	var failed []string
	for _, sh := range shards {
		a.mysqlDSN = sh.dsn
		if err := fn(ctx, sh.name); err != nil {
			failed = append(failed, fmt.Sprintf("shard %s: %v", sh.name, err))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d shards failed: %s", len(failed), len(shards), strings.Join(failed, "; "))
	}
	return nil
}

// shardGatherer adds the label shard=name to every series g gathers, so
// the metrics of the daemons of several shards stay apart when one
// Prometheus scrapes them all. An empty name leaves g as it is.
func shardGatherer(g prometheus.Gatherer, name string) prometheus.Gatherer {
	if name == "" {
		return g
	}
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := g.Gather()
		label := "shard"
		for _, mf := range mfs {
			for _, m := range mf.Metric {
				m.Label = append(m.Label, &dto.LabelPair{Name: &label, Value: &name})
				slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
			}
		}
		return mfs, err
	})
}

// shardKey is the context key of the shard a command is working on.
type shardKey struct{}

// shardOf returns the name of the shard ctx is working on, "" when the
// outbox is not sharded.
func shardOf(ctx context.Context) string {
	name, _ := ctx.Value(shardKey{}).(string)
	return name
}

// shardRun is dbRun over every --shard: fn runs once per shard with its
// database open and shardOf(ctx) naming it, or once on --mysql-dsn.
func (a *app) shardRun(sf *shardFlags, fn func(ctx context.Context, db *sql.DB, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		return a.eachShard(cmd.Context(), sf, func(ctx context.Context, name string) error {
			if name != "" {
				ctx = context.WithValue(ctx, shardKey{}, name)
			}
			db, err := a.openDB(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			return fn(ctx, db, args)
		})
	}
}
