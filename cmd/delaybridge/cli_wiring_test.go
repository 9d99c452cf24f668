package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// A typo under a group command is an error naming it, with cobra's
// suggestion when one is close; the group alone still prints its help.
func TestGroupCommands_RefuseAnUnknownSubcommandAndAloneShowHelp(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"dead", "requeue", "T", "K"}, []string{`unknown command "requeue" for "delaybridge dead"`}},
		{[]string{"task", "canel", "T", "K"}, []string{`unknown command "canel" for "delaybridge task"`, "did you mean cancel?"}},
		{[]string{"dead", "bogus"}, []string{`unknown command "bogus" for "delaybridge dead"`}},
		{[]string{"completion", "bogus"}, []string{`unknown command "bogus" for "delaybridge completion"`}},
	} {
		out, _, err := run(t, c.args...)
		if err == nil {
			t.Errorf("%q succeeded, printing:\n%s", c.args, out)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: err %q, want it to contain %q", c.args, err, w)
			}
		}
	}
	for _, group := range []string{"task", "dead", "completion"} {
		out, _, err := run(t, group)
		if err != nil || !strings.Contains(out, "Available Commands:") {
			t.Errorf("%s alone: err %v, printed:\n%s", group, err, out)
		}
	}
}

// Every command that groups others, now and added later, refuses an
// argument that names none of its subcommands.
func TestGroupCommands_EveryGroupInTheTreeRefusesAnUnknownSubcommand(t *testing.T) {
	var groups [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		for _, sub := range c.Commands() {
			p := append(append([]string(nil), path...), sub.Name())
			if sub.HasSubCommands() {
				groups = append(groups, p)
			}
			walk(sub, p)
		}
	}
	walk(newRootCmd(), nil)
	if len(groups) < 3 {
		t.Fatalf("found the groups %q, want at least task, dead and completion", groups)
	}
	for _, g := range groups {
		if _, _, err := run(t, append(g, "no-such-command")...); err == nil || !strings.Contains(err.Error(), `unknown command "no-such-command"`) {
			t.Errorf("%q no-such-command: err %v, want unknown command", g, err)
		}
	}
}

// On a database that was never migrated, task and dead say to run
// delaybridge migrate, as run does, and change nothing.
func TestTaskAndDeadCommands_OnAnUnmigratedDatabaseSayToMigrate(t *testing.T) {
	db, bare := testenv.ScratchDB(t)
	for _, args := range [][]string{
		{"task", "show", "t", "k"},
		{"task", "cancel", "t", "k"},
		{"task", "reschedule", "t", "k", "+1h"},
		{"dead", "list"},
		{"dead", "replay", "t", "k"},
	} {
		_, _, err := run(t, append(args, "--mysql-dsn", bare, "--log-level", "error")...)
		if !errors.Is(err, outbox.ErrSchemaBehind) || !strings.Contains(err.Error(), "run delaybridge migrate") {
			t.Errorf("%q on an unmigrated database: %v, want ErrSchemaBehind saying to run delaybridge migrate", args, err)
		}
	}
	var tables int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()").Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("the commands created %d table(s) in the unmigrated database", tables)
	}
}

// console refuses at start a database that lacks the schema, the single
// one or any --shard that answers, rather than serve 500s.
func TestConsoleCmd_RefusesAnUnmigratedDatabaseAtStart(t *testing.T) {
	t.Setenv("DELAYBRIDGE_MYSQL_DSN", "")
	migrated := scratch(t)
	_, bare := testenv.ScratchDB(t)
	auth := writeAuthFile(t)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"unsharded", []string{"--mysql-dsn", bare}, "database "},
		{"one shard of two", []string{"--shard", "a=" + migrated, "--shard", "b=" + bare}, "--shard b: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Without the check the console would serve until the context ends.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			out, err := runContext(ctx, append([]string{"console", "--auth-file", auth, "--listen", "127.0.0.1:0", "--log-level", "error"}, c.args...)...)
			if !errors.Is(err, outbox.ErrSchemaBehind) || !strings.Contains(err.Error(), "run delaybridge migrate") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("console on an unmigrated database: err %v, want ErrSchemaBehind after %q saying to run delaybridge migrate", err, c.want)
			}
			if strings.Contains(out, "console on") {
				t.Fatalf("the console said it serves: %q", out)
			}
		})
	}
	// A shard down at start is not refused: it is shown as down until it
	// answers.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	out, err := runContext(ctx, "console", "--auth-file", auth, "--listen", "127.0.0.1:0", "--log-level", "error",
		"--shard", "a="+migrated, "--shard", "down=delaybridge:secretpw@tcp(127.0.0.1:1)/delaybridge?timeout=2s")
	if err != nil || !strings.Contains(out, "console on") {
		t.Fatalf("console with a shard down at start: err %v, printed %q; want it served", err, out)
	}
}

// doctor parses --signing-keys as run does: keys run refuses are a failed
// check in run's words, and no secret is printed.
func TestDoctor_FailsOnSigningKeysRunRefuses(t *testing.T) {
	dsn := scratch(t)
	rabbit := testenv.RabbitFlags(t)
	for _, keys := range []string{"k1:short", "garbage S3cretKEYmaterial"} {
		_, _, runErr := run(t, append([]string{"run", "--mysql-dsn", dsn, "--http", testenv.FreeAddr(t), "--log-level", "error", "--signing-keys", keys}, rabbit...)...)
		if runErr == nil {
			t.Fatalf("run accepted --signing-keys %q", keys)
		}
		out, _, err := run(t, append([]string{"doctor", "--mysql-dsn", dsn, "--log-level", "error", "--signing-keys", keys}, rabbit...)...)
		if err == nil || !strings.Contains(out, "FAIL  "+runErr.Error()+"\n") || !strings.Contains(out, "\n1 failed,") {
			t.Errorf("doctor --signing-keys %q: err %v, want the one failed check %q; printed:\n%s", keys, err, runErr, out)
		}
		if strings.Contains(out, "S3cretKEYmaterial") {
			t.Errorf("doctor printed the secret:\n%s", out)
		}
	}
}

// An unknown --log-level names the accepted ones.
func TestLogLevel_UnknownNamesTheAcceptedLevels(t *testing.T) {
	_, _, err := run(t, "status", "--log-level", "verbose")
	if err == nil || !strings.Contains(err.Error(), `--log-level "verbose": want debug, info, warn or error`) {
		t.Fatalf("--log-level verbose: %v", err)
	}
	if a := settingsAfter(t, []string{"--log-level", "WARN"}); a.logLevel != "WARN" {
		t.Fatalf("--log-level WARN: resolved %q", a.logLevel)
	}
}

// "help TOPIC" fails for a topic that is no command, and shows the help of
// one that is.
func TestHelp_UnknownTopicFails(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
		out  string
	}{
		{[]string{"help", "bogus"}, `unknown help topic "bogus"`, ""},
		{[]string{"help", "task", "bogus"}, `unknown help topic "task bogus"`, ""},
		{[]string{"help", "task", "show"}, "", "delaybridge task show"},
		{[]string{"help"}, "", "Available Commands"},
	} {
		out, _, err := run(t, c.args...)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: err = %v, want %q", c.args, err, c.err)
			}
			continue
		}
		if err != nil || !strings.Contains(out, c.out) {
			t.Errorf("%v: err = %v, output without %q:\n%s", c.args, err, c.out, out)
		}
	}
}
