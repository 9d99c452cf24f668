package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
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
			dead, err := ops.ListDead(ctx, db, limit)
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
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\n", cli.Printable(d.Task.Topic), cli.Printable(d.Task.Key), d.Task.DueAt.Format(time.RFC3339), d.Attempts, d.PublishAttempts, cli.Printable(d.LastError))
			}
			w.Flush()
			fmt.Fprintf(a.stdout, "%d dead task(s)\n", len(dead))
			return nil
		}),
	}
	list.Flags().IntVar(&limit, "limit", 100, "most tasks to list (1 or more)")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var bulk bulkReplay
	replay := &cobra.Command{
		Use:   "replay {TOPIC KEY | --topic TOPIC | --all} [--since WHEN] [--yes]",
		Short: "Put dead tasks back to pending with their attempts reset: one, a topic's, or all",
		Long: `replay puts dead tasks back to pending with their attempts reset, so the
relay publishes them again and their handlers run.

  dead replay TOPIC KEY            one task
  dead replay --topic TOPIC --yes  every dead task of TOPIC
  dead replay --all --yes          every dead task

--since keeps to the tasks that went dead since WHEN: RFC 3339, or a
duration ago (2h or -2h). Without --yes a bulk replay changes nothing: it
says how many tasks it would replay. It replays in transactions of
` + strconv.Itoa(replayBatch) + ` tasks and prints how many it replayed.`,
		Example: `  delaybridge dead replay order-timeout 42
  delaybridge dead replay --topic order-timeout --since 2h --yes`,
		Args: func(cmd *cobra.Command, args []string) error {
			if bulk.topic != "" || bulk.all {
				return bulk.check(args)
			}
			if bulk.since != "" || bulk.yes {
				return errors.New("--since and --yes go with --topic or --all")
			}
			return topicKeyArgs(2)(cmd, args)
		},
		RunE: a.outboxRun(func(ctx context.Context, db *sql.DB, args []string) error {
			if bulk.topic != "" || bulk.all {
				return bulk.run(ctx, a, db)
			}
			if err := outbox.Replay(ctx, db, args[0], args[1]); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "replayed %s/%s: pending again\n", cli.Printable(args[0]), cli.Printable(args[1]))
			return nil
		}),
	}
	rf := replay.Flags()
	rf.StringVar(&bulk.topic, "topic", "", "replay every dead task of this topic")
	rf.BoolVar(&bulk.all, "all", false, "replay every dead task of every topic")
	rf.StringVar(&bulk.since, "since", "", "only tasks dead since WHEN (RFC 3339 or duration ago); with --topic/--all")
	rf.BoolVar(&bulk.yes, "yes", false, "replay for real; without it a bulk replay only counts")
	cmd.AddCommand(list, replay)
	return cmd
}

// replayBatch is how many dead tasks one transaction of a bulk replay puts
// back: a batch holds its rows' locks until it commits.
const replayBatch = 500

// bulkReplay is dead replay with --topic or --all.
type bulkReplay struct {
	topic string
	all   bool
	since string
	yes   bool

	from time.Time // --since, read by check
}

// check refuses a bulk replay that says too little or too much, before
// the database is opened.
func (b *bulkReplay) check(args []string) error {
	switch {
	case len(args) > 0:
		return errors.New("--topic and --all replay many tasks: leave out TOPIC KEY")
	case b.all && b.topic != "":
		return errors.New("--all and --topic: give one (--all replays every topic)")
	}
	if b.topic != "" {
		if err := broker.ValidateTopic(b.topic); err != nil {
			return fmt.Errorf("--topic: %w", err)
		}
	}
	if b.since != "" {
		s := strings.TrimSpace(b.since)
		if d, err := time.ParseDuration(strings.TrimPrefix(s, "-")); err == nil && d >= 0 {
			b.from = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			b.from = t
		} else {
			return fmt.Errorf("--since %s: want RFC 3339 (2026-12-01T08:00:00Z) or a duration ago (2h)", cli.Printable(b.since))
		}
	}
	return nil
}

// what says which dead tasks b replays.
func (b *bulkReplay) what() string {
	s := "dead task(s)"
	if b.topic != "" {
		s += " of topic " + b.topic
	}
	if !b.from.IsZero() {
		s += " dead since " + b.from.UTC().Format(time.RFC3339)
	}
	return s
}

// where is the condition on delay_task of b's tasks.
func (b *bulkReplay) where() (string, []any) {
	cond, args := "state = 'dead'", []any{}
	if b.topic != "" {
		cond += " AND topic = ?"
		args = append(args, b.topic)
	}
	if !b.from.IsZero() {
		cond += " AND updated_ms >= ?" // a dead row is last written when it goes dead
		args = append(args, b.from.UnixMilli())
	}
	return cond, args
}

func (b *bulkReplay) run(ctx context.Context, a *app, db *sql.DB) error {
	cond, args := b.where()
	if !b.yes {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM delay_task WHERE "+cond, args...).Scan(&n); err != nil {
			return fmt.Errorf("dead replay: count: %w", err)
		}
		fmt.Fprintf(a.stdout, "%d %s would be replayed: pending again with attempts reset, and their handlers run\n", n, b.what())
		return errors.New("nothing replayed: add --yes to replay them")
	}
	total := 0
	var afterDue, afterID int64 = math.MinInt64, 0
	for {
		n, lastDue, lastID, err := b.batch(ctx, db, cond, args, afterDue, afterID)
		total += n
		if err != nil {
			fmt.Fprintf(a.stdout, "replayed %d %s before an error\n", total, b.what())
			return err
		}
		if lastID == 0 {
			break
		}
		afterDue, afterID = lastDue, lastID
	}
	a.log.Info("delaybridge: dead tasks replayed", "replayed", total, "topic", b.topic, "all", b.all, "since", b.since)
	fmt.Fprintf(a.stdout, "replayed %d %s: pending again\n", total, b.what())
	return nil
}

// batch replays, in one transaction, up to replayBatch of b's tasks after
// (afterDue, afterID) in (due_ms, id) order, the order of the state index.
// It returns how many it replayed and the last one it read, id 0 when it
// read none.
func (b *bulkReplay) batch(ctx context.Context, db *sql.DB, cond string, args []any, afterDue, afterID int64) (n int, lastDue, lastID int64, err error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("dead replay: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, "SELECT id, due_ms, topic, task_key FROM delay_task FORCE INDEX (ix_delay_task_state_due) WHERE "+cond+
		" AND (due_ms > ? OR due_ms = ? AND id > ?) ORDER BY due_ms, id LIMIT ? FOR UPDATE", append(args, afterDue, afterDue, afterID, replayBatch)...)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("dead replay: %w", err)
	}
	type task struct{ topic, key string }
	var tasks []task
	for rows.Next() {
		var (
			t   task
			key []byte
		)
		if err := rows.Scan(&lastID, &lastDue, &t.topic, &key); err != nil {
			rows.Close()
			return 0, 0, 0, fmt.Errorf("dead replay: %w", err)
		}
		t.key = string(key)
		tasks = append(tasks, t)
	}
	if err := rows.Close(); err != nil {
		return 0, 0, 0, fmt.Errorf("dead replay: %w", err)
	}
	if err := rows.Err(); err != nil {
		return 0, 0, 0, fmt.Errorf("dead replay: %w", err)
	}
	for _, t := range tasks {
		// The library's replay, row by row: the same reset as one task's.
		if err := outbox.Replay(ctx, tx, t.topic, t.key); err != nil {
			return 0, 0, 0, err
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, 0, fmt.Errorf("dead replay: commit: %w", err)
	}
	return len(tasks), lastDue, lastID, nil
}
