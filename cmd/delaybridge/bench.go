package main

import (
	"context"
	"database/sql"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/bench"
	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/driver"
)

func newBenchCmd(a *app) *cobra.Command {
	var bf brokerFlags
	o := &bench.Options{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Load-test the whole path: schedule, relay, broker delay, consumer",
		Long: `bench schedules --tasks tasks through outbox.Schedule at --rate per second (0 =
as fast as the producers go), each due --delay after its scheduling (after the
bench start with --anchored) plus its share of --spread (0 = all due in one
burst), runs the relay and a consumer in this process, and waits until every
task was handled or --wait passed the last due time. --handler noop only records the run; --handler db runs outbox.Handle
with a conditional UPDATE of a bench_orders row, the order-timeout shape.
--baseline first measures a confirmed publish of the same number of messages
straight through the adapter, from four goroutines, without the database, in
the same run (its and the relay's start and end go into the JSON); on
RabbitMQ it then purges those messages from the topic's queue, so the relay
starts from a broker as empty as the baseline did.
--preload schedules everything before the relay starts, to measure the relay
alone against a full table. --relay-only leaves its messages in the broker,
where they keep moving until due (RabbitMQ's ladder re-queues them level by
level), which loads the broker for later runs: give such runs a
--rabbit-prefix of their own and delete its queues afterwards.
--floor first runs the same workload through the in-process broker of
--database-only, then through --broker, and reports both: when a target is
out of reach, the floor shows whether the database and this process alone
could reach it on this box at that moment.
With --rate (a paced run, not --relay-only) it also times a one-row
autocommit UPDATE of a bench_commits row every 50 ms through the run and
prints that commit's percentiles (db_commit_ms in the JSON): every claim the
relay makes waits for such a commit, so a task's lateness has its tail.

It prints progress to stderr and a summary; with --json the last line of
stdout is one JSON object. lost = tasks never handled, dup_effects = effects
applied more than once (noop: handler runs beyond the first), early = handled
before due; lateness_ms runs from due to handled, published_late_ms from due
to the broker's confirm (0 for a task published ahead: the relay's share of
the lateness), delivered_late_ms from due to the message reaching the
consumer (the broker's share, and the relay's for a task published late; the
rest is the consumer's), published_after_commit_ms from the later of due and the
commit of the transaction that scheduled the task (the relay's reaction,
without the producer's own commit). It exits non-zero when anything was lost, early, or (db handler)
applied twice.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return bench.Run(cmd.Context(), a.benchEnv(&bf), o, cmd.Flags())
		},
	}
	bf.register(cmd.Flags())
	o.Register(cmd.Flags())
	return cmd
}

// benchEnv is what the bench takes from the other commands: the broker
// flags bf, the development defaults, the session and the metrics of run.
func (a *app) benchEnv(bf *brokerFlags) bench.Env {
	return bench.Env{
		Log:           a.log,
		Stdout:        a.stdout,
		Stderr:        a.stderr,
		Broker:        func() driver.Settings { return bf.Settings },
		Lookahead:     lookaheadSetting,
		ListenMetrics: a.listenMetrics,
		Open: func(ctx context.Context) (*cli.Session, error) {
			a.useDevDefaults(bf)
			return a.openSession(ctx, bf, true, true)
		},
		Metrics: func(ln net.Listener, db *sql.DB, brokerAddr string) (*delaybridge.Metrics, func()) {
			m := newMetrics(db, 30*time.Second, a.log)
			return m.Metrics, a.serveMetricsOn(ln, m, db, brokerAddr)
		},
	}
}
