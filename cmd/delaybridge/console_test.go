package main

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/console/consoletest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
	"github.com/spf13/pflag"
)

// testConsolePassword is the password of the console credential the
// tests serve with.
const testConsolePassword = consoletest.Password

// writeAuthFile writes a console credential file and returns its path.
func writeAuthFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(f, []byte("ops:"+testConsolePassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestConsoleCmd_RefusesBadShardFlagsWithoutShowingPasswords(t *testing.T) {
	t.Setenv("DELAYBRIDGE_MYSQL_DSN", "")
	auth := writeAuthFile(t)
	good := "a=u:secretpw@tcp(127.0.0.1:1)/o"
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"illegal name", []string{"--shard", "a b=u:secretpw@tcp(h:1)/o"}, "--shard: want NAME=DSN or NAME=@FILE"},
		{"no name", []string{"--shard", "=u:secretpw@tcp(h:1)/o"}, "--shard: want NAME=DSN"},
		{"no DSN", []string{"--shard", "a"}, "--shard: want NAME=DSN"},
		{"duplicate name", []string{"--shard", good, "--shard", "a=u:secretpw@tcp(127.0.0.1:2)/o"}, "--shard a given twice"},
		{"bad DSN", []string{"--shard", "b=u:secretpw@tcp(h:1)o"}, "--shard b: DSN"},
		{"missing DSN file", []string{"--shard", "b=@/nonexistent/b.dsn"}, "--shard b:"},
		{"empty DSN", []string{"--shard", good, "--shard", "b="}, "--shard b: empty DSN"},
		{"with --mysql-dsn", []string{"--shard", good, "--mysql-dsn", "u:secretpw@tcp(127.0.0.1:1)/o"}, "--mysql-dsn and --shard are both set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := run(t, append([]string{"console", "--auth-file", auth, "--listen", "127.0.0.1:0"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "secretpw") {
				t.Fatalf("error shows the password: %v", err)
			}
		})
	}
}

// consoleTopic is the topic of most tasks of setupConsole.
const consoleTopic = consoletest.Topic

// consoleBundle is delaybridge console, run as from the command line over
// a migrated scratch database that holds consoletest's tasks.
type consoleBundle struct {
	consoletest.Client
	db  *sql.DB
	dsn string
	ids map[string]int64
}

var consoleServes = regexp.MustCompile(`delaybridge console on (http://\S+)/`)

// setupConsole schedules consoletest's tasks in a scratch database and
// serves delaybridge console over it until the test ends.
func setupConsole(t *testing.T, readOnly bool) *consoleBundle {
	t.Helper()
	dsn := scratch(t)
	b := &consoleBundle{db: openDSN(t, dsn), dsn: dsn}
	b.ids = consoletest.Schedule(t, b.db)
	args := append([]string{"console", "--mysql-dsn", dsn, "--auth-file", writeAuthFile(t), "--listen", "127.0.0.1:0", "--log-level", "error"}, testenv.RabbitFlags(t)...)
	if readOnly {
		args = append(args, "--read-only")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out testenv.SyncBuffer
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(io.Discard)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("console: %v", err)
		}
	})
	if !testutil.Eventually(30*time.Second, 20*time.Millisecond, func() bool { return consoleServes.MatchString(out.String()) }) {
		t.Fatalf("console did not start: %q", out.String())
	}
	b.URL = consoleServes.FindStringSubmatch(out.String())[1]
	return b
}

// The console's doctor (its brokers page's "Run the checks") runs doctor's
// own checks, on the database or on every --shard by name, and on the
// broker; they show no password.
func TestConsoleEnv_DoctorRunsDoctorsChecksOnEveryShard(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB and RabbitMQ")
	t.Setenv("DELAYBRIDGE_MYSQL_DSN", "")
	single, dsnA, dsnB := scratch(t), scratch(t), scratch(t)
	for _, c := range []struct {
		name  string
		dsn   string
		shard []string
		want  []string
	}{
		{"unsharded", single, nil, []string{"outbox schema at version", "RabbitMQ"}},
		{"sharded", "", []string{"a=" + dsnA, "b=" + dsnB, "c=delaybridge:secretpw@tcp(127.0.0.1:1)/delaybridge"},
			[]string{"shard a: outbox schema at version", "shard b: outbox schema at version", "shard c: database", "RabbitMQ"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := &app{mysqlDSN: c.dsn, stdout: io.Discard, stderr: io.Discard, log: slog.New(slog.DiscardHandler)}
			var bf brokerFlags
			var sf shardFlags
			fs := pflag.NewFlagSet("console", pflag.ContinueOnError)
			bf.register(fs)
			sf.register(fs)
			args := testenv.RabbitFlags(t)
			for _, s := range c.shard {
				args = append(args, "--shard", s)
			}
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			r := a.consoleEnv(&bf, &sf).Doctor(context.Background(), 2*time.Second)
			var got strings.Builder
			for _, ch := range r.Checks {
				got.WriteString(ch.Level + " " + ch.Text + "\n")
			}
			for _, want := range c.want {
				if !strings.Contains(got.String(), want) {
					t.Errorf("doctor's checks lack %q:\n%s", want, got.String())
				}
			}
			if strings.Contains(got.String(), "secretpw") {
				t.Errorf("doctor's checks show a password:\n%s", got.String())
			}
		})
	}
}
