package main

import "github.com/spf13/cobra"

// newRootCmd builds the command tree. Subcommands are added by the files named
// after them.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "delaybridge",
		Short:         "Reliable delayed tasks on RabbitMQ and RocketMQ, backed by a MySQL outbox",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	return root
}
