package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/outbox"
)

func newDeadCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead",
		Short: "List dead tasks or put them back to pending",
	}
	var (
		limit  int
		asJSON bool
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List dead tasks, oldest due first, with their last error",
		Args:  cobra.NoArgs,
		// --limit is checked before the database is opened: bad input
		// changes nothing.
		PreRunE: func(*cobra.Command, []string) error {
			if limit < 1 {
				return fmt.Errorf("--limit %d: want 1 or more", limit)
			}
			return nil
		},
		RunE: a.outboxRun(func(ctx context.Context, db *sql.DB, _ []string) error {
			dead, err := outbox.ListDead(ctx, db, limit)
			if err != nil {
				return err
			}
			if asJSON {
				out := make([]map[string]any, len(dead))
				for i, d := range dead {
					out[i] = infoJSON(d)
				}
				return json.NewEncoder(a.stdout).Encode(out)
			}
			w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "TOPIC\tKEY\tDUE\tHANDLER ATTEMPTS\tPUBLISH ATTEMPTS\tLAST ERROR")
			for _, d := range dead {
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\n", printable(d.Task.Topic), printable(d.Task.Key), d.Task.DueAt.Format(time.RFC3339), d.Attempts, d.PublishAttempts, printable(d.LastError))
			}
			w.Flush()
			fmt.Fprintf(a.stdout, "%d dead task(s)\n", len(dead))
			return nil
		}),
	}
	list.Flags().IntVar(&limit, "limit", 100, "most tasks to list (1 or more)")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	replay := &cobra.Command{
		Use:   "replay TOPIC KEY",
		Short: "Put a dead task back to pending with its attempts reset",
		Args:  topicKeyArgs(2),
		RunE: a.outboxRun(func(ctx context.Context, db *sql.DB, args []string) error {
			if err := outbox.Replay(ctx, db, args[0], args[1]); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "replayed %s/%s: pending again\n", printable(args[0]), printable(args[1]))
			return nil
		}),
	}
	cmd.AddCommand(list, replay)
	return cmd
}
