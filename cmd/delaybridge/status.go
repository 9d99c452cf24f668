package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

func newStatusCmd(a *app) *cobra.Command {
	var (
		asJSON bool
		live   bool
		grace  time.Duration
		window time.Duration
		sf     shardFlags
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the outbox backlog, overdue and dead tasks, and recent lateness",
		Long: `status shows the outbox backlog by state and topic, the finished tasks kept,
the oldest pending task, overdue and dead tasks, and recent lateness. A task
is overdue once it is past due by --grace and not finished (pending or
published). Relays and consumers announce themselves in the database
(outbox.Announce), so status also says:

  NO CONSUMER        a topic has overdue published tasks and no live consumer
  NO RELAY           pending tasks are past due and no relay is live
  RELAY BEHIND       pending tasks are past due though a relay is live
  TOPOLOGY MISMATCH  live relays or consumers use different broker settings
                     (prefix, group, ladder): tasks sit in queues nobody reads

Counting tasks by state and topic reads the whole table, so the counts come from
a summary that ` + "`delaybridge run`" + ` refreshes in the background (every
--stats-interval), and status says how old they are. Without a summary, or with
--live, status counts the table once itself.

With --shard NAME=DSN (repeated), status reports every outbox shard in turn,
each under its name; with --json, one object per shard, its "shard" field
naming it. A shard it cannot read is reported and the others still are.`,
		Args: cobra.NoArgs,
		// The durations are checked before any database is opened: bad
		// input changes nothing.
		PreRunE: func(*cobra.Command, []string) error {
			if grace < 0 {
				return fmt.Errorf("--grace %v: want 0 (overdue as soon as past due) or more", grace)
			}
			if window < 0 {
				return fmt.Errorf("--window %v: want 0 (no lateness summary) or more", window)
			}
			return nil
		},
		RunE: a.shardRun(&sf, func(ctx context.Context, db *sql.DB, _ []string) error {
			now := time.Now()
			var st *ops.Stats
			var err error
			if !live {
				if st, err = ops.ReadStats(ctx, db, now, grace, window); err != nil {
					return err
				}
			}
			// No summary yet (no daemon has run): count once, whatever it
			// costs, rather than show nothing.
			if live || st.CountsAt.IsZero() {
				if st, err = ops.CountStats(ctx, db, now, grace, window); err != nil {
					return err
				}
			}
			unconsumed, err := ops.Unconsumed(ctx, db, now, grace, cli.PresenceExpiry)
			if err != nil {
				return err
			}
			procs, err := cli.ReadProcesses(ctx, db, st)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(statusReport{statusJSON: statusJSON{Shard: shardOf(ctx), Stats: st, Unconsumed: unconsumed}, Processes: procs})
			}
			if name := shardOf(ctx); name != "" {
				fmt.Fprintf(a.stdout, "== shard %s\n", name)
			}
			w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "STATE\tTOPIC\tTASKS")
			for _, state := range tableStates(st.Backlog) {
				topics := make([]string, 0, len(st.Backlog[state]))
				for t := range st.Backlog[state] {
					topics = append(topics, t)
				}
				sort.Strings(topics)
				for _, t := range topics {
					// A row inserted by hand may hold any state: quoted when
					// it is not printable, so it cannot drive the terminal.
					fmt.Fprintf(w, "%s\t%s\t%d\n", cli.Printable(string(state)), cli.Printable(t), st.Backlog[state][t])
				}
			}
			fmt.Fprintf(w, "done\t*\t%d\ncancelled\t*\t%d\n", st.Done, st.Cancelled)
			w.Flush()
			oldest := "none"
			if !st.OldestPendingDue.IsZero() {
				oldest = fmt.Sprintf("%s (%s)", st.OldestPendingDue.Format(time.RFC3339), cli.Ago(now, st.OldestPendingDue))
			}
			if st.Live {
				fmt.Fprintln(a.stdout, "counts: counted live now (no summary from `delaybridge run` yet, or --live)")
			} else {
				fmt.Fprintf(a.stdout, "counts: as of %s (%s ago; `delaybridge run` refreshes them)\n",
					st.CountsAt.Format(time.RFC3339), cli.HumanDuration(st.CountsAge))
			}
			fmt.Fprintf(a.stdout, "oldest pending due: %s\noverdue (pending or published, > %s past due): %d (%d pending)\ndead: %d\n",
				oldest, cli.HumanDuration(grace), st.Overdue, st.OverduePending, st.Dead)
			cli.PrintUnconsumed(a.stdout, unconsumed)
			for _, l := range procs.Lines() {
				fmt.Fprintln(a.stdout, l)
			}
			l := st.Lateness
			fmt.Fprintf(a.stdout, "lateness of %d tasks due in the last %s: p50 %dms p90 %dms p99 %dms max %dms\n", l.Count, cli.HumanDuration(window), l.P50, l.P90, l.P99, l.Max)
			return nil
		}),
	}
	sf.register(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object instead of a table")
	cmd.Flags().BoolVar(&live, "live", false, "count the table now, not the counts run keeps (slow on a large outbox)")
	cmd.Flags().DurationVar(&grace, "grace", 30*time.Second, "how far past due an unfinished task counts as overdue")
	cmd.Flags().DurationVar(&window, "window", 10*time.Minute, "how far back finished tasks feed lateness (0 = none)")
	return cmd
}

// tableStates orders the backlog's states for the table: pending,
// published, dead, then any state no delaybridge writes (a row inserted by
// hand as 'PENDING' or 'new'), which nothing claims or cleans: listed, an
// operator sees it.
func tableStates(backlog map[outbox.State]map[string]int) []outbox.State {
	states := []outbox.State{outbox.StatePending, outbox.StatePublished, outbox.StateDead}
	var other []outbox.State
	for s := range backlog {
		if !slices.Contains(states, s) {
			other = append(other, s)
		}
	}
	slices.Sort(other)
	return append(states, other...)
}

// statusReport is status --json: statusJSON and the processes' signals.
type statusReport struct {
	statusJSON
	cli.Processes
}
