package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/internal/outbox"
)

func newMigrateCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the delay_task outbox table (idempotent)",
		Args:  cobra.NoArgs,
		RunE: a.dbRun(func(ctx context.Context, db *sql.DB, _ []string) error {
			applied, err := outbox.Migrate(ctx, db)
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintln(a.stdout, "schema up to date")
				return nil
			}
			fmt.Fprintf(a.stdout, "applied migrations %v\n", applied)
			return nil
		}),
	}
}
