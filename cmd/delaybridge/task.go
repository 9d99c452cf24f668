package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

func newTaskCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Show, cancel or reschedule one task",
	}
	var asJSON bool
	show := &cobra.Command{
		Use:   "show TOPIC KEY",
		Short: "Show a task's state, due time, attempts and last error",
		Args:  topicKeyArgs(2),
		RunE: a.outboxRun(func(ctx context.Context, db *sql.DB, args []string) error {
			info, err := outbox.Get(ctx, db, args[0], args[1])
			if err != nil {
				return err
			}
			printInfo(a, info, asJSON)
			return nil
		}),
	}
	show.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cancel := &cobra.Command{
		Use:   "cancel TOPIC KEY",
		Short: "Cancel a task that is not done yet: its handler, the business action, never runs",
		Args:  topicKeyArgs(2),
		RunE: a.outboxRun(func(ctx context.Context, db *sql.DB, args []string) error {
			if err := outbox.Cancel(ctx, db, args[0], args[1]); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "cancelled %s/%s\n", cli.Printable(args[0]), cli.Printable(args[1]))
			fmt.Fprintf(a.stdout, "warning: its handler will never run, so what it does (the business action) will not happen; schedule it again to have it done\n")
			return nil
		}),
	}
	rescheduleRun := a.outboxRun(func(ctx context.Context, db *sql.DB, args []string) error {
		due, err := cli.ParseWhen(args[2], time.Now())
		if err != nil {
			return err
		}
		if err := outbox.Reschedule(ctx, db, args[0], args[1], due); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "rescheduled %s/%s to %s\n", cli.Printable(args[0]), cli.Printable(args[1]), due.UTC().Format(time.RFC3339Nano))
		return nil
	})
	reschedule := &cobra.Command{
		Use:   "reschedule TOPIC KEY WHEN",
		Short: "Move a task to WHEN: an RFC 3339 time, +duration from now or -duration ago",
		Example: `  delaybridge task reschedule order-timeout 42 +30m
  delaybridge task reschedule order-timeout 42 -5m    # 5 minutes ago: due at once
  delaybridge task reschedule order-timeout 42 2026-12-01T08:00:00Z`,
		// pflag would read WHEN -5m as the flags -5 and -m: Args parses the
		// flags itself, a word that starts with '-' and a digit being an
		// argument (no flag is a digit).
		DisableFlagParsing: true,
		// WHEN is checked before the database is opened: bad input changes nothing.
		Args: func(cmd *cobra.Command, args []string) error {
			if err := parseFlagsWithNegatives(cmd, args); err != nil {
				return err
			}
			args = cmd.Flags().Args()
			if err := topicKeyArgs(3)(cmd, args); err != nil {
				return err
			}
			_, err := cli.ParseWhen(args[2], time.Now())
			return err
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return rescheduleRun(cmd, cmd.Flags().Args()) },
	}
	cmd.AddCommand(show, cancel, reschedule)
	return cmd
}

// parseFlagsWithNegatives parses args into cmd's flags, as cobra would,
// except that a word starting with '-' and a digit is an argument unless it
// is a flag's value: every such argument goes behind a "--", in order.
// --help is returned as pflag.ErrHelp, for cobra to print the help.
func parseFlagsWithNegatives(cmd *cobra.Command, args []string) error {
	cmd.InheritedFlags() // merges the parents' persistent flags into cmd.Flags()
	fs := cmd.Flags()
	var flags, positional []string
	for i := 0; i < len(args); i++ {
		s := args[i]
		switch {
		case s == "--":
			positional = append(positional, args[i+1:]...)
			i = len(args)
		case len(s) > 1 && s[0] == '-' && s[1] >= '0' && s[1] <= '9', s == "-" || !strings.HasPrefix(s, "-"):
			positional = append(positional, s)
		default:
			flags = append(flags, s)
			if flagTakesNext(fs, s) {
				if i+1 == len(args) {
					// pflag would take the "--" below as the value.
					return cmd.FlagErrorFunc()(cmd, fmt.Errorf("flag needs an argument: %s", s))
				}
				i++
				flags = append(flags, args[i])
			}
		}
	}
	if err := fs.Parse(append(append(flags, "--"), positional...)); err != nil {
		return cmd.FlagErrorFunc()(cmd, err)
	}
	if help, _ := fs.GetBool("help"); help {
		return pflag.ErrHelp
	}
	return nil
}

// flagTakesNext reports whether the flag word s (--name, -abc) takes the
// next word as its value, as pflag reads it.
func flagTakesNext(fs *pflag.FlagSet, s string) bool {
	if name, ok := strings.CutPrefix(s, "--"); ok {
		if strings.Contains(name, "=") {
			return false
		}
		f := fs.Lookup(name)
		return f != nil && f.NoOptDefVal == ""
	}
	short := s[1:]
	for i := 0; i < len(short); i++ {
		f := fs.ShorthandLookup(short[i : i+1])
		if f == nil || short[i+1:] != "" && short[i+1] == '=' {
			return false
		}
		if f.NoOptDefVal == "" {
			return i == len(short)-1 // the rest of the word is its value otherwise
		}
	}
	return false
}

// topicKeyArgs takes exactly n arguments, the first two a topic and a key
// that could name a task: a malformed one is an error naming it, before
// the database is opened, rather than "no such task".
func topicKeyArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.ExactArgs(n)(cmd, args); err != nil {
			return err
		}
		if err := broker.ValidateTopic(args[0]); err != nil {
			return fmt.Errorf("TOPIC: %w", err)
		}
		if err := broker.ValidateKey(args[1]); err != nil {
			return fmt.Errorf("KEY %s: %w", cli.Printable(args[1]), err)
		}
		return nil
	}
}

func printInfo(a *app, i *outbox.TaskInfo, asJSON bool) {
	if asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(infoJSON(i))
		return
	}
	fmt.Fprintf(a.stdout, "id:          %d\ntopic:       %s\nkey:         %s\nstate:       %s\ndue:         %s\ngeneration:  %d\nattempts:    handler %d, publish %d\nrescues:     %d\nsnoozes:     %d\npayload:     %d bytes\n",
		i.ID, cli.Printable(i.Task.Topic), cli.Printable(i.Task.Key), cli.Printable(string(i.State)), i.Task.DueAt.Format(time.RFC3339Nano), i.Generation, i.Attempts, i.PublishAttempts, i.Rescues, i.Snoozes, len(i.Task.Payload))
	if !i.PublishedAt.IsZero() {
		fmt.Fprintf(a.stdout, "published:   %s\n", i.PublishedAt.Format(time.RFC3339Nano))
	}
	if !i.DoneAt.IsZero() {
		fmt.Fprintf(a.stdout, "done:        %s (lateness %v)\n", i.DoneAt.Format(time.RFC3339Nano), i.DoneAt.Sub(i.Task.DueAt))
	}
	if i.LastError != "" {
		fmt.Fprintf(a.stdout, "last error:  %s\n", cli.Printable(i.LastError))
	}
}

func infoJSON(i *outbox.TaskInfo) map[string]any {
	m := map[string]any{
		"id": i.ID, "topic": i.Task.Topic, "key": i.Task.Key, "state": i.State, "due": i.Task.DueAt,
		"generation": i.Generation, "publish_attempts": i.PublishAttempts, "attempts": i.Attempts, "rescues": i.Rescues,
		"snoozes": i.Snoozes, "payload_bytes": len(i.Task.Payload), "last_error": i.LastError, "created": i.CreatedAt,
	}
	if !i.PublishedAt.IsZero() {
		m["published"] = i.PublishedAt
	}
	if !i.DoneAt.IsZero() {
		m["done"] = i.DoneAt
	}
	return m
}
