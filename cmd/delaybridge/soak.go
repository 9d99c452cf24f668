package main

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/soak"
)

func newSoakCmd(a *app) *cobra.Command {
	var bf brokerFlags
	o := &soak.Options{}
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "Run an order service's peak hour: orders, payments racing, a relay of its own",
		Long: `soak runs an order service on the local database and broker for --duration:
it creates --orders-rate orders a second, each scheduling its cancellation
--timeout later in the order's own transaction, and pays --pay-ratio of them at
a random moment before the timeout (--pay-last-share of them within the last
--pay-last, or a tenth of it past the timeout), each payment cancelling the task
in its own transaction and refused when the cancellation already ran. One
order in twenty also runs the same transactions as yardsticks: without
Schedule and Cancel, and with a bare indexed row in their place.

It starts "delaybridge run" as a process of its own, with the broker flags given
here and each --run-arg, and consumes the cancellations itself, as a service
would. Each --report-every it prints a line: orders, payments, cancellations,
waiting tasks, the lateness, both transactions' p99 beside their yardsticks,
the size of delay_task, and each server's CPU and memory. When the orders
stop it times a "status", a /metrics scrape and the console overview. It waits
--settle past the last timeout, then checks every order: lost, duplicate
effects, early, paid yet cancelled, unpaid past due. It exits non-zero when
one of them is not 0. --waiting writes that many tasks first, due after the
soak, so the table holds the seeds' millions. docs/cli.md and BENCHMARKS.md
show the seeds' figures.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			runFlags := newRunCmd(a).Flags()
			env := soak.Env{
				Log: a.log, Stdout: a.stdout, Stderr: a.stderr,
				Open: func(ctx context.Context) (*cli.Session, error) {
					a.useDevDefaults(&bf)
					return a.openSession(ctx, &bf, true, true)
				},
				ChildEnv: func() []string {
					// The flags given here that run takes too, as its
					// environment, the command line's values first.
					env := append(os.Environ(), "DELAYBRIDGE_MYSQL_DSN="+a.mysqlDSN)
					if bf.AMQPURL != "" {
						env = append(env, "DELAYBRIDGE_AMQP_URL="+bf.AMQPURL)
					}
					cmd.Flags().Visit(func(f *pflag.Flag) {
						if runFlags.Lookup(f.Name) == nil || f.Name == "http" {
							return
						}
						v := f.Value.String()
						if sv, ok := f.Value.(pflag.SliceValue); ok {
							v = strings.Join(sv.GetSlice(), ",")
						}
						env = append(env, "DELAYBRIDGE_"+strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))+"="+v)
					})
					return env
				},
			}
			// Interrupted, soak still stops its run process and deletes
			// the tasks --waiting wrote.
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return soak.Run(ctx, env, o)
		},
	}
	bf.register(cmd.Flags())
	o.Register(cmd.Flags())
	return cmd
}
