package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// dead replay --topic and --all replay many dead tasks, in batches, only
// with --yes (without it they count), --since keeping to the tasks that
// went dead since then; other states and other topics stay as they are.
func TestDeadReplay_ReplaysATopicOrAllInBatchesOnlyWithYes(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	dsn := scratch(t)
	db := openDSN(t, dsn)
	ctx := context.Background()
	var tasks []outbox.Task
	due := time.Now().Add(-time.Hour)
	for i := range replayBatch + 250 { // more than a batch, some on one due time
		tasks = append(tasks, outbox.Task{Topic: "a", Key: fmt.Sprintf("a-%04d", i), DueAt: due.Add(time.Duration(i%300) * time.Millisecond)})
	}
	for i := range 20 {
		tasks = append(tasks, outbox.Task{Topic: "b", Key: fmt.Sprintf("b-%02d", i), DueAt: due})
	}
	tasks = append(tasks, outbox.Task{Topic: "a", Key: "pending-one", DueAt: due})
	if err := outbox.ScheduleMany(ctx, db, tasks); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	testenv.MustExec(t, db, "UPDATE delay_task SET state = 'dead', attempts = 5, last_error = 'boom', updated_ms = ? WHERE task_key <> 'pending-one'", now.Add(-3*time.Hour).UnixMilli())
	// Ten of b went dead within the last hour.
	testenv.MustExec(t, db, "UPDATE delay_task SET updated_ms = ? WHERE topic = 'b' AND task_key < 'b-10'", now.Add(-10*time.Minute).UnixMilli())
	count := func(where string) int {
		t.Helper()
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM delay_task WHERE " + where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	out, _, err := run(t, "dead", "replay", "--topic", "a", "--mysql-dsn", dsn)
	if err == nil || !strings.Contains(err.Error(), "add --yes") || !strings.Contains(out, fmt.Sprintf("%d dead task(s) of topic a would be replayed", replayBatch+250)) {
		t.Fatalf("--topic without --yes: %v\n%s", err, out)
	}
	if n := count("state = 'dead'"); n != replayBatch+270 {
		t.Fatalf("a replay without --yes changed %d task(s)", replayBatch+270-n)
	}

	out = mustRun(t, "dead", "replay", "--topic", "a", "--yes", "--mysql-dsn", dsn)
	if !strings.Contains(out, fmt.Sprintf("replayed %d dead task(s) of topic a", replayBatch+250)) {
		t.Errorf("--topic a --yes printed:\n%s", out)
	}
	if n := count("topic = 'a' AND state = 'pending' AND attempts = 0 AND generation = 1 AND last_error IS NULL"); n != replayBatch+250 {
		t.Errorf("%d of topic a's %d dead tasks pending again with attempts reset", n, replayBatch+250)
	}
	if n := count("task_key = 'pending-one' AND generation = 0"); n != 1 {
		t.Error("a pending task was replayed")
	}
	if n := count("topic = 'b' AND state = 'dead'"); n != 20 {
		t.Errorf("replaying topic a left %d of topic b dead, want 20", n)
	}

	out = mustRun(t, "dead", "replay", "--all", "--since", "1h", "--yes", "--mysql-dsn", dsn)
	if !strings.Contains(out, "replayed 10 dead task(s) dead since ") || count("topic = 'b' AND state = 'dead'") != 10 {
		t.Errorf("--all --since 1h replayed other than the 10 dead within the hour:\n%s", out)
	}
	out = mustRun(t, "dead", "replay", "--all", "--yes", "--mysql-dsn", dsn)
	if !strings.Contains(out, "replayed 10 dead task(s)") || count("state = 'dead'") != 0 {
		t.Errorf("--all: %d still dead\n%s", count("state = 'dead'"), out)
	}

	for args, want := range map[string]string{
		"--topic a --all":        "give one",
		"--topic a t k":          "leave out TOPIC KEY",
		"--topic bad.topic":      "--topic",
		"--all --since tomorrow": "--since tomorrow",
		"t k --yes":              "go with --topic or --all",
		"t":                      "accepts 2 arg(s)",
	} {
		_, _, err := run(t, append([]string{"dead", "replay", "--mysql-dsn", dsn}, strings.Fields(args)...)...)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("dead replay %s: %v, want %q", args, err, want)
		}
	}
	// One task still replays as before.
	testenv.MustExec(t, db, "UPDATE delay_task SET state = 'dead' WHERE task_key = 'b-00'")
	if out := mustRun(t, "dead", "replay", "b", "b-00", "--mysql-dsn", dsn); !strings.Contains(out, "replayed b/b-00: pending again") {
		t.Errorf("one task:\n%s", out)
	}
}
