package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// run executes the delaybridge command tree in-process with args and
// returns what it printed.
func run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errb)
	err = root.ExecuteContext(context.Background())
	return out.String(), errb.String(), err
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := run(t, args...)
	if err != nil {
		t.Fatalf("delaybridge %v: %v\nstdout: %s\nstderr: %s", args, err, out, errOut)
	}
	return out
}

// scratch returns the DSN of a fresh migrated database.
func scratch(t *testing.T) string {
	t.Helper()
	_, dsn := testenv.ScratchDB(t)
	mustRun(t, "migrate", "--mysql-dsn", dsn)
	return dsn
}

func TestMigrate_AppliesOnceThenReportsUpToDate(t *testing.T) {
	_, dsn := testenv.ScratchDB(t)
	migs, err := outbox.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var versions []int
	for _, m := range migs {
		versions = append(versions, m.Version)
	}
	if out := mustRun(t, "migrate", "--mysql-dsn", dsn); !strings.Contains(out, fmt.Sprintf("applied migrations %v", versions)) {
		t.Fatalf("first migrate printed %q, want every version %v", out, versions)
	}
	if out := mustRun(t, "migrate", "--mysql-dsn", dsn); !strings.Contains(out, "schema up to date") {
		t.Fatalf("second migrate printed %q", out)
	}
}

func TestTaskCommands_ShowCancelReschedule(t *testing.T) {
	dsn := scratch(t)
	pool := openDSN(t, dsn)
	if _, err := outbox.Schedule(context.Background(), pool, outbox.Task{Topic: "order-cancel", Key: "o-1", DueAt: time.Now().Add(time.Hour), Payload: []byte("xyz")}); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, "task", "show", "order-cancel", "o-1", "--mysql-dsn", dsn)
	if !strings.Contains(out, "state:       pending") || !strings.Contains(out, "payload:     3 bytes") {
		t.Fatalf("task show printed:\n%s", out)
	}
	out = mustRun(t, "task", "reschedule", "order-cancel", "o-1", "+2h", "--mysql-dsn", dsn)
	if !strings.Contains(out, "rescheduled order-cancel/o-1 to ") {
		t.Fatalf("reschedule printed %q", out)
	}
	var shown map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "task", "show", "order-cancel", "o-1", "--json", "--mysql-dsn", dsn)), &shown); err != nil {
		t.Fatal(err)
	}
	if shown["generation"].(float64) != 1 {
		t.Fatalf("generation after reschedule: %v", shown["generation"])
	}
	mustRun(t, "task", "cancel", "order-cancel", "o-1", "--mysql-dsn", dsn)
	if out := mustRun(t, "task", "show", "order-cancel", "o-1", "--mysql-dsn", dsn); !strings.Contains(out, "state:       cancelled") {
		t.Fatalf("after cancel:\n%s", out)
	}
	if _, _, err := run(t, "task", "show", "order-cancel", "missing", "--mysql-dsn", dsn); err == nil || !strings.Contains(err.Error(), "no such task") {
		t.Fatalf("show missing: %v", err)
	}
	if _, _, err := run(t, "task", "reschedule", "order-cancel", "o-1", "tomorrow", "--mysql-dsn", dsn); err == nil || !strings.Contains(err.Error(), "RFC 3339") {
		t.Fatalf("reschedule with a bad time: %v", err)
	}
}

func TestDeadCommands_ListAndReplay(t *testing.T) {
	dsn := scratch(t)
	pool := openDSN(t, dsn)
	if _, err := outbox.Schedule(context.Background(), pool, outbox.Task{Topic: "t", Key: "k", DueAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec("UPDATE delay_task SET state = 'dead', last_error = 'handler failed 10 times', publish_attempts = 3"); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, "dead", "list", "--mysql-dsn", dsn)
	if !strings.Contains(out, "handler failed 10 times") || !strings.Contains(out, "1 dead task(s)") {
		t.Fatalf("dead list printed:\n%s", out)
	}
	mustRun(t, "dead", "replay", "t", "k", "--mysql-dsn", dsn)
	info, err := outbox.Get(context.Background(), pool, "t", "k")
	if err != nil || info.State != outbox.StatePending || info.PublishAttempts != 0 || info.Generation != 1 {
		t.Fatalf("after replay: %+v, %v", info, err)
	}
	if _, _, err := run(t, "dead", "replay", "t", "k", "--mysql-dsn", dsn); err == nil || !strings.Contains(err.Error(), "not dead") {
		t.Fatalf("replaying a pending task: %v", err)
	}
}

func TestStatus_JSONCountsBacklogAndLateness(t *testing.T) {
	dsn := scratch(t)
	pool := openDSN(t, dsn)
	ctx := context.Background()
	for i, st := range []string{"pending", "published", "dead", "done"} {
		key := st
		if _, err := outbox.Schedule(ctx, pool, outbox.Task{Topic: "orders", Key: key, DueAt: time.Now().Add(-time.Minute)}); err != nil {
			t.Fatal(err, i)
		}
		if _, err := pool.Exec("UPDATE delay_task SET state = ?, done_ms = due_ms + 40 WHERE task_key = ?", st, key); err != nil {
			t.Fatal(err)
		}
	}
	var st ops.Stats
	if err := json.Unmarshal([]byte(mustRun(t, "status", "--json", "--mysql-dsn", dsn)), &st); err != nil {
		t.Fatal(err)
	}
	if st.Backlog["pending"]["orders"] != 1 || st.Backlog["published"]["orders"] != 1 || st.Dead != 1 || st.Done != 1 || st.Overdue != 2 || st.OverduePending != 1 {
		t.Fatalf("status: %+v", st)
	}
	if st.Lateness.Count != 1 || st.Lateness.Max != 40 {
		t.Fatalf("lateness %+v, want one sample of 40ms", st.Lateness)
	}
	if !st.Live {
		t.Fatal("status without a summary did not say it counted live")
	}
	if out := mustRun(t, "status", "--mysql-dsn", dsn); !strings.Contains(out, "dead: 1") || !strings.Contains(out, "counted live") {
		t.Fatalf("status table:\n%s", out)
	}
	// A row written by hand with a state no delaybridge uses is never
	// claimed nor cleaned; the table lists it (docs/table-contract.md).
	if _, err := pool.Exec("UPDATE delay_task SET state = 'PENDING' WHERE task_key = 'pending'"); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, "status", "--mysql-dsn", dsn); !regexp.MustCompile(`(?m)^PENDING +orders +1$`).MatchString(out) {
		t.Fatalf("status table does not list the row in state PENDING:\n%s", out)
	}
}

// settingsAfter runs a probe subcommand with args and returns the settings
// the root command resolved for it.
func settingsAfter(t *testing.T, args []string) app {
	t.Helper()
	a, _ := probe(t, args...)
	return a
}

// probe runs a subcommand that does nothing with args and returns the
// settings the root command resolved and what it logged.
func probe(t *testing.T, args ...string) (app, string) {
	t.Helper()
	a := &app{}
	var errb bytes.Buffer
	root := buildRoot(a)
	root.AddCommand(&cobra.Command{Use: "probe", RunE: func(*cobra.Command, []string) error { return nil }})
	root.SetArgs(append([]string{"probe"}, args...))
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&errb)
	if err := root.Execute(); err != nil {
		t.Fatalf("probe %v: %v", args, err)
	}
	return *a, errb.String()
}

// clearSettingsEnv unsets every DELAYBRIDGE_* variable for the test (make
// test exports the local services' settings): it starts from none.
func clearSettingsEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, envPrefix) {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

func TestConfig_FlagBeatsEnvironmentBeatsFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "delaybridge.conf")
	if err := os.WriteFile(file, []byte("# comment\nlog-level = \"error\"\nmysql-dsn = file:file@tcp(127.0.0.1:1)/x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	clearSettingsEnv(t)
	t.Setenv("DELAYBRIDGE_CONFIG", file)
	if got := settingsAfter(t, nil); got.mysqlDSN != "file:file@tcp(127.0.0.1:1)/x" || got.logLevel != "error" {
		t.Fatalf("file: dsn %q level %q", got.mysqlDSN, got.logLevel)
	}
	t.Setenv("DELAYBRIDGE_MYSQL_DSN", "env:env@tcp(127.0.0.1:2)/x")
	if got := settingsAfter(t, nil); got.mysqlDSN != "env:env@tcp(127.0.0.1:2)/x" || got.logLevel != "error" {
		t.Fatalf("env over file: dsn %q level %q", got.mysqlDSN, got.logLevel)
	}
	if got := settingsAfter(t, []string{"--mysql-dsn", "flag:flag@tcp(127.0.0.1:3)/x"}); got.mysqlDSN != "flag:flag@tcp(127.0.0.1:3)/x" {
		t.Fatalf("flag over env: dsn %q", got.mysqlDSN)
	}
	if err := os.WriteFile(file, []byte("mysql_dns = oops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := run(t, "status"); err == nil || !strings.Contains(err.Error(), `unknown setting "mysql_dns"`) {
		t.Fatalf("unknown setting in the file: %v", err)
	}
}

// One config file serves every command: each takes its own settings and
// skips other commands' (a command without broker flags reads a file that
// names the broker), and a name no command has is still an error.
func TestConfig_OneFileServesEveryCommandAndATypoIsStillAnError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "delaybridge.conf")
	shared := "mysql-dsn = file:file@tcp(127.0.0.1:1)/x\nbroker = rocket\nretention = 24h\nrabbit-prefetch = 100\nlisten = 127.0.0.1:9000\n"
	if err := os.WriteFile(file, []byte(shared), 0o600); err != nil {
		t.Fatal(err)
	}
	clearSettingsEnv(t)
	t.Setenv("DELAYBRIDGE_CONFIG", file)
	if got := settingsAfter(t, nil); got.mysqlDSN != "file:file@tcp(127.0.0.1:1)/x" {
		t.Fatalf("a command without broker flags read dsn %q from the shared file", got.mysqlDSN)
	}
	if err := os.WriteFile(file, []byte(shared+"brokr = rabbit\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := run(t, "status"); err == nil || !strings.Contains(err.Error(), `unknown setting "brokr"`) {
		t.Fatalf("a typo in the shared file: %v, want it refused", err)
	}
}

func TestSecrets_NeverPrintedWhenTheDatabaseRefuses(t *testing.T) {
	testenv.MySQL(t)
	const password = "S3cret-Pa55word"
	for _, args := range [][]string{{"status"}, {"migrate"}, {"task", "show", "t", "k"}, {"dead", "list"}} {
		out, errOut, err := run(t, append(args, "--mysql-dsn", "delaybridge:"+password+"@tcp(127.0.0.1:3306)/delaybridge")...)
		if err == nil {
			t.Fatalf("%v with a wrong password succeeded", args)
		}
		for _, s := range []string{out, errOut, err.Error()} {
			if strings.Contains(s, password) {
				t.Fatalf("%v printed the password: %q", args, s)
			}
		}
		if !strings.Contains(err.Error(), "xxxxx") {
			t.Fatalf("%v error does not show the redacted DSN: %v", args, err)
		}
	}
}

func openDSN(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// A key or last error holding a newline or a terminal escape is printed
// escaped by dead list and task show, so it cannot forge a line.
func TestDeadListAndTaskShow_EscapeControlCharacters(t *testing.T) {
	dsn := scratch(t)
	pool := openDSN(t, dsn)
	const key = "k\x1b[31m\nFORGED 1 dead task(s)"
	if _, err := outbox.Schedule(context.Background(), pool, outbox.Task{Topic: "t", Key: key, DueAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec("UPDATE delay_task SET state = 'dead', last_error = ?", "boom\r\n\x1b[2JFORGED all good"); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"dead", "list"}, {"task", "show", "t", key}} {
		out := mustRun(t, append(args, "--mysql-dsn", dsn)...)
		if strings.ContainsAny(out, "\x1b\r") || strings.Contains(out, "\nFORGED") {
			t.Errorf("%v printed a control character or a forged line:\n%s", args[:2], out)
		}
		if !strings.Contains(out, `"k\x1b[31m\nFORGED 1 dead task(s)"`) || !strings.Contains(out, `"boom\r\n\x1b[2JFORGED all good"`) {
			t.Errorf("%v does not show the escaped key and error:\n%s", args[:2], out)
		}
	}
}

// With a summary, status shows its counts (not the table's now) and their
// age; --live counts the table.
func TestStatus_ReadsTheSummaryAndSaysHowOld(t *testing.T) {
	dsn := scratch(t)
	pool := openDSN(t, dsn)
	ctx := context.Background()
	schedule := func(key string) {
		t.Helper()
		if _, err := outbox.Schedule(ctx, pool, outbox.Task{Topic: "orders", Key: key, DueAt: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	schedule("counted")
	if err := outbox.RefreshStats(ctx, pool, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec("UPDATE delay_task_stats_run SET computed_ms = computed_ms - 120000"); err != nil {
		t.Fatal(err)
	}
	schedule("since")

	var st ops.Stats
	if err := json.Unmarshal([]byte(mustRun(t, "status", "--json", "--mysql-dsn", dsn)), &st); err != nil {
		t.Fatal(err)
	}
	if st.Live || st.Backlog["pending"]["orders"] != 1 || st.CountsAgeMS < 120000 || st.CountsAgeMS > 180000 {
		t.Fatalf("status from a 2-minute-old summary: %+v", st)
	}
	if out := mustRun(t, "status", "--mysql-dsn", dsn); !strings.Contains(out, "counts: as of") || !strings.Contains(out, "(2m") {
		t.Fatalf("status table does not give the counts' age:\n%s", out)
	}
	if err := json.Unmarshal([]byte(mustRun(t, "status", "--json", "--live", "--mysql-dsn", dsn)), &st); err != nil {
		t.Fatal(err)
	}
	if !st.Live || st.Backlog["pending"]["orders"] != 2 {
		t.Fatalf("status --live: %+v", st)
	}
}

// A topic or key that no task can have is refused by name before the
// database is opened (no --mysql-dsn is needed to see it), and an error
// carrying a control character prints it escaped, its line breaks kept.
func TestTaskAndDeadArgs_AreCheckedBeforeTheDatabaseAndErrorsPrintSafely(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"task", "show", "two words", "k"}, "TOPIC: "},
		{[]string{"task", "cancel", "t", ""}, "KEY : "},
		{[]string{"task", "reschedule", "t", "k\x01", "+1m"}, `KEY "k\x01": `},
		{[]string{"dead", "replay", "t/x", "k"}, "TOPIC: "},
		{[]string{"task", "show", "t"}, "accepts 2 arg(s)"},
	} {
		_, _, err := run(t, append(c.args, "--mysql-dsn", "nobody:x@tcp(127.0.0.1:1)/none")...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.args, err, c.want)
		}
	}
	for in, want := range map[string]string{
		"plain error":                      "plain error",
		"first\nsecond":                    "first\nsecond",
		"no such task: t/\"k\\x1b[2J\"":    "no such task: t/\"k\\x1b[2J\"",
		"raw \x1b[2Jescape\r and bell\x07": `raw \x1b[2Jescape\r and bell\a`,
		"bidi\u202eevil\ttab":              `bidi\u202eevil` + "\ttab",
	} {
		if got := terminalSafe(in); got != want {
			t.Errorf("terminalSafe(%q) = %q, want %q", in, got, want)
		}
	}
}
