package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// task reschedule takes WHEN as -5m (5 minutes ago), which pflag would
// read as flags, with the flags before or after the arguments, and shows
// the form in its help.
func TestTaskReschedule_TakesANegativeDurationAsWhen(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	dsn := scratch(t)
	db := openDSN(t, dsn)
	for _, key := range []string{"k", "-42"} {
		if _, err := outbox.Schedule(context.Background(), db, outbox.Task{Topic: "t", Key: key, DueAt: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	due := func(key string) time.Time {
		t.Helper()
		var ms int64
		if err := db.QueryRow("SELECT due_ms FROM delay_task WHERE topic = 't' AND task_key = ?", key).Scan(&ms); err != nil {
			t.Fatal(err)
		}
		return time.UnixMilli(ms)
	}
	for _, args := range [][]string{
		{"task", "reschedule", "t", "k", "-5m", "--mysql-dsn", dsn},
		{"task", "reschedule", "--mysql-dsn", dsn, "t", "k", "-5m"},
		{"task", "reschedule", "--mysql-dsn=" + dsn, "t", "k", "-5m", "--log-level", "error"},
		{"task", "reschedule", "t", "k", "--mysql-dsn", dsn, "--", "-5m"},
	} {
		testenv.MustExec(t, db, "UPDATE delay_task SET due_ms = ? WHERE task_key = 'k'", time.Now().Add(time.Hour).UnixMilli())
		before := time.Now()
		if out := mustRun(t, args...); !strings.Contains(out, "rescheduled t/k to ") {
			t.Errorf("%q printed:\n%s", args, out)
		}
		if got := due("k"); got.Before(before.Add(-5*time.Minute-time.Second)) || got.After(time.Now().Add(-5*time.Minute+time.Millisecond)) { // stored rounded up to the millisecond
			t.Errorf("%q: due %v, want about 5 minutes before %v", args, got, before)
		}
	}
	// A key that looks like a negative number is the key, not WHEN.
	mustRun(t, "task", "reschedule", "t", "-42", "+2h", "--mysql-dsn", dsn)
	if got := due("-42"); got.Before(time.Now().Add(time.Hour + 50*time.Minute)) {
		t.Errorf("key -42: due %v, want in 2 hours", got)
	}
	for args, want := range map[string]string{
		"t k":                 "accepts 3 arg(s)",
		"t k -5m --no-such":   "unknown flag: --no-such",
		"t k --5m":            "unknown flag: --5m",
		"t k -5x":             "bad duration",
		"t k +-5m":            "negative",
		"t k -5m --log-level": "flag needs an argument",
	} {
		_, _, err := run(t, append([]string{"task", "reschedule", "--mysql-dsn", dsn}, strings.Fields(args)...)...)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("task reschedule %s: %v, want %q", args, err, want)
		}
	}
	out, _, err := run(t, "task", "reschedule", "--help")
	if err != nil || !strings.Contains(out, "-5m") || !strings.Contains(out, "--mysql-dsn") {
		t.Errorf("task reschedule --help: %v\n%s", err, out)
	}
}

// Cancelling a task says, on the command line and in the console's
// confirmation, that what its handler does will then never happen.
func TestTaskCancel_SaysTheBusinessActionWillNeverHappen(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	b := setupConsole(t, false)
	out := mustRun(t, "task", "cancel", consoleTopic, "k-soon-2", "--mysql-dsn", b.dsn)
	if !strings.Contains(out, "cancelled ") || !strings.Contains(out, "will never run") || !strings.Contains(out, "business action") {
		t.Errorf("task cancel printed:\n%s", out)
	}
	code, page := b.Post(t, fmt.Sprintf("/tasks/%d/cancel", b.ids["k-later"]), url.Values{"csrf": {b.Token(t)}}, true)
	if code != http.StatusOK || !strings.Contains(page, "will never run") || !strings.Contains(page, "business action") {
		t.Errorf("the console's confirmation of a cancel (%d) does not say the action will not happen:\n%s", code, page)
	}
}
