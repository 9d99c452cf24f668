package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/outbox"
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
		Short: "Cancel a task that is not done yet",
		Args:  topicKeyArgs(2),
		RunE: a.outboxRun(func(ctx context.Context, db *sql.DB, args []string) error {
			if err := outbox.Cancel(ctx, db, args[0], args[1]); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "cancelled %s/%s\n", printable(args[0]), printable(args[1]))
			return nil
		}),
	}
	reschedule := &cobra.Command{
		Use:   "reschedule TOPIC KEY WHEN",
		Short: "Move a task to WHEN: an RFC 3339 time or +duration from now",
		Args:  topicKeyArgs(3),
		// WHEN is checked before the database is opened: bad input changes nothing.
		PreRunE: func(cmd *cobra.Command, args []string) error {
			_, err := parseWhen(args[2], time.Now())
			return err
		},
		RunE: a.outboxRun(func(ctx context.Context, db *sql.DB, args []string) error {
			due, err := parseWhen(args[2], time.Now())
			if err != nil {
				return err
			}
			if err := outbox.Reschedule(ctx, db, args[0], args[1], due); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "rescheduled %s/%s to %s\n", printable(args[0]), printable(args[1]), due.UTC().Format(time.RFC3339Nano))
			return nil
		}),
	}
	cmd.AddCommand(show, cancel, reschedule)
	return cmd
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
			return fmt.Errorf("KEY %s: %w", printable(args[1]), err)
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
	fmt.Fprintf(a.stdout, "id:          %d\ntopic:       %s\nkey:         %s\nstate:       %s\ndue:         %s\ngeneration:  %d\nattempts:    handler %d, publish %d\nrescues:     %d\npayload:     %d bytes\n",
		i.ID, printable(i.Task.Topic), printable(i.Task.Key), printable(string(i.State)), i.Task.DueAt.Format(time.RFC3339Nano), i.Generation, i.Attempts, i.PublishAttempts, i.Rescues, len(i.Task.Payload))
	if !i.PublishedAt.IsZero() {
		fmt.Fprintf(a.stdout, "published:   %s\n", i.PublishedAt.Format(time.RFC3339Nano))
	}
	if !i.DoneAt.IsZero() {
		fmt.Fprintf(a.stdout, "done:        %s (lateness %v)\n", i.DoneAt.Format(time.RFC3339Nano), i.DoneAt.Sub(i.Task.DueAt))
	}
	if i.LastError != "" {
		fmt.Fprintf(a.stdout, "last error:  %s\n", printable(i.LastError))
	}
}

func infoJSON(i *outbox.TaskInfo) map[string]any {
	m := map[string]any{
		"id": i.ID, "topic": i.Task.Topic, "key": i.Task.Key, "state": i.State, "due": i.Task.DueAt,
		"generation": i.Generation, "publish_attempts": i.PublishAttempts, "attempts": i.Attempts, "rescues": i.Rescues,
		"payload_bytes": len(i.Task.Payload), "last_error": i.LastError, "created": i.CreatedAt,
	}
	if !i.PublishedAt.IsZero() {
		m["published"] = i.PublishedAt
	}
	if !i.DoneAt.IsZero() {
		m["done"] = i.DoneAt
	}
	return m
}

// printable returns s as a table or a report may show it: unchanged when
// every rune is printable, otherwise quoted with Go's escapes (strconv.Quote).
// Keys and last errors come from whoever scheduled the task or from a
// broker; printed raw, a newline or a terminal escape in one would forge
// lines of the output, and a tab would shift a table's columns. Text that
// starts with '"' is quoted too, so an escaped and a plain value never look
// alike.
func printable(s string) string {
	if utf8.ValidString(s) && !strings.HasPrefix(s, `"`) && strings.IndexFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) < 0 {
		return s
	}
	return strconv.Quote(s)
}
