package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/settings"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

func TestReadSecretFile_TrimsOneLineAndRefusesEverythingElse(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, body := range []string{"s3cr3t", "s3cr3t\n", "s3cr3t\r\n", "s3cr3t\n\n"} {
		if got, err := readSecretFile(write("ok", body)); err != nil || got != "s3cr3t" {
			t.Errorf("readSecretFile(%q) = %q, %v", body, got, err)
		}
	}
	for body, want := range map[string]string{"": "is empty", " \n": "is empty", "a\nb\n": "more than one line", strings.Repeat("x", settings.MaxSecretFile+1): "more than a secret"} {
		_, err := readSecretFile(write("bad", body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("readSecretFile of %d bytes: %v, want %q", len(body), err, want)
		}
		if err != nil && len(body) > 2 && strings.Contains(err.Error(), strings.TrimSpace(body)[:2]) {
			t.Errorf("the error quotes the file: %v", err)
		}
	}
	if _, err := readSecretFile(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
}

// A URL or DSN with a tab, a quote, a backslash or an unencoded '/' does not
// parse, and net/url's error quotes it, escaped, or quotes a piece of its
// password as a port: scrub must still hide the password.
func TestScrub_HidesThePasswordOfAURLThatDoesNotParse(t *testing.T) {
	const pw = "S3CRETpw"
	for _, raw := range []string{
		"amqp://u:" + pw + "@127.0.0.1:5672/\ttab",
		"amqp://u:" + pw + "\"x@127.0.0.1:5672/\t",
		"amqp://u:" + pw + "\\x@127.0.0.1:5672/\t",
		"amqp://u:" + pw + "/x@127.0.0.1:5672/",
		"amqp://u:" + pw + "%zz@127.0.0.1:5672/",
	} {
		_, perr := url.Parse(raw)
		if perr == nil {
			t.Fatalf("url.Parse(%q) succeeded; the case tests nothing", raw)
		}
		err := scrub(fmt.Errorf("rabbit: dial: %w", perr), raw)
		if strings.Contains(err.Error(), pw[:5]) {
			t.Errorf("scrub of the error for %q: %v", raw, err)
		}
		if !strings.Contains(err.Error(), "u:xxxxx@") {
			t.Errorf("scrub of the error for %q does not show the redacted URL: %v", raw, err)
		}
	}
	// A quote in a DSN's password, as a driver would print it with %q.
	dsn := `u:` + pw + `"x@tcp(127.0.0.1:3306)/db`
	if err := scrub(fmt.Errorf("bad DSN %q", dsn), dsn); strings.Contains(err.Error(), pw[:5]) {
		t.Errorf("scrub of a %%q-quoted DSN: %v", err)
	}
}

func TestSecretFiles_ReadTheValueAndRefuseTwoSources(t *testing.T) {
	clearEnv(t)
	file := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(file, []byte("fromfile:pw@tcp(127.0.0.1:9)/x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := settingsAfter(t, []string{"--mysql-dsn-file", file}); got.mysqlDSN != "fromfile:pw@tcp(127.0.0.1:9)/x" {
		t.Fatalf("--mysql-dsn-file: dsn %q", got.mysqlDSN)
	}
	t.Setenv("DELAYBRIDGE_MYSQL_DSN_FILE", file)
	if got := settingsAfter(t, nil); got.mysqlDSN != "fromfile:pw@tcp(127.0.0.1:9)/x" {
		t.Fatalf("DELAYBRIDGE_MYSQL_DSN_FILE: dsn %q", got.mysqlDSN)
	}
	t.Setenv("DELAYBRIDGE_MYSQL_DSN", "env:pw@tcp(127.0.0.1:9)/x")
	if _, _, err := run(t, "status"); err == nil || !strings.Contains(err.Error(), "--mysql-dsn and --mysql-dsn-file are both set") {
		t.Fatalf("DSN and DSN file both set: %v", err)
	}
}

// clearEnv unsets every DELAYBRIDGE_* variable for the test (make test
// exports the local services' settings).
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, envPrefix) {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

// secretsEnv is a database user, a RabbitMQ user and a RocketMQ secret key
// made for one test, each with a password no other text contains.
type secretsEnv struct {
	password  string // MariaDB and RabbitMQ password
	wrong     string // a second distinctive password, never valid
	rocketKey string // RocketMQ ACL secret key
	dsn       string
	amqpURL   string
	bin       string
	dir       string
}

func (s *secretsEnv) secrets() []string { return []string{s.password, s.wrong, s.rocketKey} }

func setupSecrets(t *testing.T) *secretsEnv {
	t.Helper()
	testenv.MySQL(t)
	testenv.AMQP(t)
	testenv.RocketMQ(t)
	n := rand.Uint64()
	s := &secretsEnv{
		password:  fmt.Sprintf("Pw7%016xQz", n),
		wrong:     fmt.Sprintf("Wr0ng%016xKv", n),
		rocketKey: fmt.Sprintf("Sk9%016xJx", n),
		dir:       t.TempDir(),
	}
	user := fmt.Sprintf("dbsec_%d", n%1_000_000_000)
	db := "delaybridge_" + user
	mariadbRoot(t, fmt.Sprintf("CREATE DATABASE %[2]s; CREATE USER '%[1]s'@'127.0.0.1' IDENTIFIED BY '%[3]s'; GRANT ALL ON %[2]s.* TO '%[1]s'@'127.0.0.1';", user, db, s.password))
	t.Cleanup(func() {
		mariadbRoot(t, fmt.Sprintf("DROP USER IF EXISTS '%s'@'127.0.0.1'; DROP DATABASE IF EXISTS %s;", user, db))
	})
	s.dsn = fmt.Sprintf("%s:%s@tcp(127.0.0.1:3306)/%s", user, s.password, db)

	testenv.Rabbitmqctl(t, "add_user", user, s.password)
	t.Cleanup(func() { testenv.Rabbitmqctl(t, "delete_user", user) })
	testenv.Rabbitmqctl(t, "set_permissions", "-p", "/", user, ".*", ".*", ".*")
	s.amqpURL = fmt.Sprintf("amqp://%s:%s@127.0.0.1:5672/", user, s.password)

	// The real binary, so whatever any library writes to the process's own
	// stdout and stderr is captured too.
	s.bin = filepath.Join(s.dir, "delaybridge")
	if out, err := exec.Command("go", "build", "-o", s.bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return s
}

// file writes body to a 0600 file and returns its path.
func (s *secretsEnv) file(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(s.dir, name)
	if err := os.WriteFile(p, []byte(body+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// baseEnv is the process environment without DELAYBRIDGE_* variables, plus
// extra.
func baseEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// cmdResult is what one run of the binary printed.
type cmdResult struct {
	args []string
	out  string
	err  error
}

// run runs the binary with env and args, within a minute.
func (s *secretsEnv) run(t *testing.T, env []string, args ...string) cmdResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return cmdResult{args: args, out: string(out), err: err}
}

// check fails the test if r shows any secret, and if r did not end as
// wanted: ok says whether it should succeed, and want is text it must show.
func (s *secretsEnv) check(t *testing.T, r cmdResult, ok bool, want string) {
	t.Helper()
	for _, sec := range s.secrets() {
		if strings.Contains(r.out, sec) {
			t.Errorf("delaybridge %v printed a secret:\n%s", r.args, r.out)
		}
	}
	if (r.err == nil) != ok {
		t.Errorf("delaybridge %v: exit %v, want success %v\n%s", r.args, r.err, ok, r.out)
	}
	if !strings.Contains(r.out, want) {
		t.Errorf("delaybridge %v: output lacks %q:\n%s", r.args, want, r.out)
	}
}

func TestSecrets_NoCommandPrintsAPasswordOrKey(t *testing.T) {
	s := setupSecrets(t)
	prefix := testenv.Name("sec")
	t.Cleanup(func() { testenv.DeleteRabbitPrefix(t, testenv.AMQP(t), prefix) })
	dsnFile := s.file(t, "mysql-dsn", s.dsn)
	keyFile := s.file(t, "rocketmq-secret-key", s.rocketKey)
	// The DSN from a file, the AMQP URL from the environment, debug logs.
	env := baseEnv("DELAYBRIDGE_MYSQL_DSN_FILE="+dsnFile, "DELAYBRIDGE_AMQP_URL="+s.amqpURL, "DELAYBRIDGE_LOG_LEVEL=debug",
		"DELAYBRIDGE_RABBIT_PREFIX="+prefix, "DELAYBRIDGE_RABBIT_DEPTH=8")
	// ACL is off on the shared test broker, so it ignores the credentials;
	// the client still signs every request with the secret key.
	rocketArgs := []string{"--broker", "rocket", "--rocketmq-max-delay", "1h", "--rocketmq-precision", "100ms",
		"--rocketmq-group-prefix", testenv.Name("sec"), "--rocketmq-access-key", "delaybridge-test-ak", "--rocketmq-secret-key-file", keyFile}

	s.check(t, s.run(t, env, "migrate"), true, "applied migrations")
	pool, err := sql.Open("mysql", s.dsn+"?parseTime=true")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	for _, task := range []outbox.Task{
		{Topic: "sec", Key: "later", DueAt: time.Now().Add(time.Hour), Payload: []byte("p")},
		{Topic: "sec", Key: "now", DueAt: time.Now()},
		{Topic: "sec", Key: "dead", DueAt: time.Now().Add(-time.Hour)},
	} {
		if _, err := outbox.Schedule(ctx, pool, task); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec("UPDATE delay_task SET state = 'dead', last_error = 'gave up' WHERE task_key = 'dead'"); err != nil {
		t.Fatal(err)
	}

	s.check(t, s.run(t, env, "status"), true, "dead: 1")
	s.check(t, s.run(t, env, "status", "--json"), true, `"dead": 1`)
	s.check(t, s.run(t, env, "task", "show", "sec", "later"), true, "state:       pending")
	s.check(t, s.run(t, env, "task", "show", "sec", "later", "--json"), true, `"state": "pending"`)
	s.check(t, s.run(t, env, "task", "reschedule", "sec", "later", "+2h"), true, "rescheduled sec/later")
	s.check(t, s.run(t, env, "task", "cancel", "sec", "later"), true, "sec/later")
	s.check(t, s.run(t, env, "task", "show", "sec", "missing"), false, "no such task")
	s.check(t, s.run(t, env, "dead", "list"), true, "gave up")
	s.check(t, s.run(t, env, "dead", "list", "--json"), true, "gave up")
	s.check(t, s.run(t, env, "dead", "replay", "sec", "dead"), true, "replayed sec/dead")
	s.check(t, s.run(t, env, "doctor"), true, "0 failed")
	s.check(t, s.run(t, env, append([]string{"doctor", "--probe-delay", "1s", "--rocketmq-namesrv", testenv.RocketMQ(t)}, rocketArgs...)...), false, "mqadmin updateTopic")
	s.check(t, s.run(t, env, "bench", "--tasks", "40", "--delay", "500ms", "--spread", "500ms", "--handler", "noop", "--json", "--wait", "60s"), true, `"lost":0`)

	t.Run("run and its HTTP endpoints", func(t *testing.T) { s.checkRun(t, env, pool, "rabbit", nil) })
	t.Run("run on RocketMQ with ACL credentials", func(t *testing.T) {
		s.checkRun(t, env, pool, "rocket", append([]string{"--rocketmq-namesrv", testenv.RocketMQ(t)}, rocketArgs...))
	})

	t.Run("failure paths", func(t *testing.T) {
		wrongDSN := strings.Replace(s.dsn, s.password, s.wrong, 1)
		wrongURL := strings.Replace(s.amqpURL, s.password, s.wrong, 1)
		plain := baseEnv()
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"status", "--mysql-dsn", wrongDSN}, "Access denied"},
			{[]string{"migrate", "--mysql-dsn", strings.Replace(wrongDSN, "127.0.0.1:3306", "127.0.0.1:1", 1)}, "connection refused"},
			{[]string{"status", "--mysql-dsn", strings.Replace(wrongDSN, ")/", "/", 1)}, "(unparseable DSN)"},
			{[]string{"doctor", "--mysql-dsn", s.dsn, "--amqp-url", wrongURL}, "RabbitMQ at amqp://"},
			{[]string{"run", "--mysql-dsn", s.dsn, "--amqp-url", strings.Replace(wrongURL, "127.0.0.1:5672", "127.0.0.1:1", 1), "--http", "127.0.0.1:0"}, "rabbit"},
			{[]string{"run", "--mysql-dsn", s.dsn, "--amqp-url", strings.Replace(wrongURL, ":5672", ":notaport", 1), "--http", "127.0.0.1:0"}, "rabbit"},
			{[]string{"doctor", "--mysql-dsn", s.dsn, "--amqp-url", wrongURL, "--amqp-tls-ca", keyFile}, "no PEM certificate"},
		} {
			s.check(t, s.run(t, plain, c.args...), false, c.want)
		}
		// One stray character makes the URL unparseable, and net/url quotes
		// it escaped; a '/' in the password makes its start a port.
		httpArgs := []string{"--mysql-dsn", s.dsn, "--http", "127.0.0.1:0"}
		for _, bad := range []string{wrongURL + "\ttab", strings.Replace(wrongURL, s.wrong, s.wrong+`"`, 1), strings.Replace(wrongURL, s.wrong, s.wrong+`\`, 1) + "\x7f"} {
			s.check(t, s.run(t, append(plain, "DELAYBRIDGE_AMQP_URL="+bad), append([]string{"run"}, httpArgs...)...), false, "not a valid AMQP URL")
			s.check(t, s.run(t, append(plain, "DELAYBRIDGE_AMQP_URL="+bad), "doctor", "--mysql-dsn", s.dsn), false, "not a valid AMQP URL")
		}
		slash := strings.Replace(wrongURL, s.wrong, "12/"+s.wrong, 1)
		s.check(t, s.run(t, plain, "doctor", "--mysql-dsn", s.dsn, "--amqp-url", slash), false, "unreachable")
		s.check(t, s.run(t, plain, append([]string{"run", "--amqp-url", slash}, httpArgs...)...), false, "rabbit")
		// A config line with a space where its '=' belongs: the part of the
		// password before the '=' in it stays unprinted.
		conf := s.file(t, "typo.conf", "mysql-dsn "+strings.Replace(wrongDSN, s.wrong, s.wrong+"=x", 1))
		s.check(t, s.run(t, plain, "status", "--config", conf), false, "line 1")
		// Two sources of one secret, and a config file with a bad line
		// after the DSN: the errors name the setting, never the value.
		s.check(t, s.run(t, append(plain, "DELAYBRIDGE_MYSQL_DSN="+wrongDSN, "DELAYBRIDGE_MYSQL_DSN_FILE="+dsnFile), "status"), false, "are both set")
		conf = s.file(t, "delaybridge.conf", "mysql-dsn = "+wrongDSN+"\n"+s.wrong)
		s.check(t, s.run(t, plain, "status", "--config", conf), false, "line 2")
		// A secret file readable by others is used, with a warning.
		loose := s.file(t, "loose-dsn", s.dsn)
		if err := os.Chmod(loose, 0o644); err != nil {
			t.Fatal(err)
		}
		s.check(t, s.run(t, plain, "status", "--mysql-dsn-file", loose), true, "readable by group or others")
		s.check(t, s.run(t, plain, "status", "--mysql-dsn=", "--shard", "a=@"+loose), true, "readable by group or others")
	})
}

// checkRun runs the daemon with args until it published a due task, and
// scrapes its endpoints; on RabbitMQ it then revokes the database password
// under it, so the failure paths of /readyz, /metrics and the relay's logs
// are exercised too.
func (s *secretsEnv) checkRun(t *testing.T, env []string, pool *sql.DB, brokerKind string, args []string) {
	// bench relayed every task of the table already: a fresh one for run.
	key := "for-run-" + brokerKind
	if _, err := outbox.Schedule(context.Background(), pool, outbox.Task{Topic: "sec", Key: key, DueAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	addr := testenv.FreeAddr(t)
	var out syncBuffer
	cmd := exec.Command(s.bin, append([]string{"run", "--http", addr, "--grace", "1s"}, args...)...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	}
	defer stop()
	if !testutil.Eventually(30*time.Second, 100*time.Millisecond, func() bool {
		info, err := outbox.Get(context.Background(), pool, "sec", key)
		return err == nil && info.State == outbox.StatePublished && strings.Contains(out.String(), "delaybridge running")
	}) {
		stop()
		t.Fatalf("run never published the due task:\n%s", out.String())
	}
	var scraped []string
	scrape := func(path string, wantCode int, want string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		scraped = append(scraped, string(b))
		if resp.StatusCode != wantCode || !strings.Contains(string(b), want) {
			t.Errorf("GET %s: %d, want %d with %q:\n%s", path, resp.StatusCode, wantCode, want, b)
		}
	}
	scrape("/metrics", 200, "delaybridge_outbox_up 1")
	scrape("/healthz", 200, "ok")
	scrape("/readyz", 200, "ready")
	if brokerKind != "rabbit" {
		stop()
		s.check(t, cmdResult{args: cmd.Args[1:], out: out.String() + strings.Join(scraped, "\n")}, true, "delaybridge stopped")
		return
	}

	// Revoke: a new password and every session of the user killed.
	user := strings.SplitN(s.dsn, ":", 2)[0]
	mariadbRoot(t, fmt.Sprintf("ALTER USER '%s'@'127.0.0.1' IDENTIFIED BY '%s'", user, s.wrong))
	defer mariadbRoot(t, fmt.Sprintf("ALTER USER '%s'@'127.0.0.1' IDENTIFIED BY '%s'", user, s.password))
	killSessions(t, user)
	scrape("/readyz", 503, "Access denied")
	scrape("/metrics", 200, "delaybridge_outbox_up 0")
	stop()
	s.check(t, cmdResult{args: cmd.Args[1:], out: out.String() + strings.Join(scraped, "\n")}, true, "delaybridge stopped")
}

// killSessions ends every MariaDB session of user.
func killSessions(t *testing.T, user string) {
	t.Helper()
	out, err := exec.Command("mariadb", "-uroot", "-N", "-e", fmt.Sprintf("SELECT id FROM information_schema.processlist WHERE user = '%s'", user)).Output()
	if err != nil {
		t.Fatalf("list sessions: %v", err)
	}
	for _, id := range strings.Fields(string(out)) {
		_ = exec.Command("mariadb", "-uroot", "-e", "KILL "+id).Run()
	}
}

func TestConfigFile_WarnsWhenOthersCanReadTheSecretItHolds(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	dsnFile := filepath.Join(dir, "dsn")
	if err := os.WriteFile(dsnFile, []byte("u:pw@tcp(127.0.0.1:9)/x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		body string
		mode os.FileMode
		warn bool
	}{
		{"mysql-dsn = u:pw@tcp(127.0.0.1:9)/x\n", 0o644, true},
		{"mysql-dsn = u:pw@tcp(127.0.0.1:9)/x\n", 0o640, true},
		{"mysql-dsn = u:pw@tcp(127.0.0.1:9)/x\n", 0o600, false},
		{"mysql-dsn-file = " + dsnFile + "\nlog-level = info\n", 0o644, false},
	} {
		file := filepath.Join(dir, "delaybridge.conf")
		if err := os.WriteFile(file, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(file, c.mode); err != nil {
			t.Fatal(err)
		}
		_, logs := probe(t, "--config", file)
		if got := strings.Contains(logs, "config file holds a secret and") && strings.Contains(logs, "readable by group or others"); got != c.warn {
			t.Errorf("config %q mode %04o: warned %v, want %v\n%s", c.body, c.mode, got, c.warn, logs)
		}
	}
}

// A config file reached through a symbolic link is read, and the log names
// the file behind the link.
func TestConfigFile_SymbolicLinkIsFollowedAndNamed(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "real.conf")
	if err := os.WriteFile(target, []byte("log-level = info\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "delaybridge.conf")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, logs := probe(t, "--config", link); !strings.Contains(logs, "config file is a symbolic link") || !strings.Contains(logs, "target="+target) {
		t.Errorf("config through a link: logs do not name the target:\n%s", logs)
	}
	if _, logs := probe(t, "--config", target); strings.Contains(logs, "symbolic link") {
		t.Errorf("a plain config file is reported as a link:\n%s", logs)
	}
}

// Without configuration a command does not try the development
// credentials: it says which settings are missing, before connecting to
// anything. demo and bench fall back to the local services and say so.
func TestCommands_RequireAnExplicitDatabaseAndRabbitMQ(t *testing.T) {
	clearEnv(t)
	for _, args := range [][]string{{"status"}, {"migrate"}, {"dead", "list"}, {"run", "--amqp-url", "amqp://u:p@127.0.0.1:1/"}} {
		_, _, err := run(t, args...)
		if err == nil || !strings.Contains(err.Error(), "no outbox database configured: set --mysql-dsn or --mysql-dsn-file (environment DELAYBRIDGE_MYSQL_DSN") {
			t.Errorf("%v without a DSN: %v", args, err)
		}
	}
	_, _, err := run(t, "run", "--mysql-dsn", "u:p@tcp(127.0.0.1:1)/x")
	if err == nil || !strings.Contains(err.Error(), "no RabbitMQ configured: set --amqp-url or --amqp-url-file (environment DELAYBRIDGE_AMQP_URL") {
		t.Errorf("run without an AMQP URL: %v", err)
	}
	out, _, err := run(t, "doctor")
	if err == nil || !strings.Contains(out, "FAIL  database: no outbox database configured") || !strings.Contains(out, "FAIL  rabbit: no RabbitMQ configured") {
		t.Errorf("doctor without settings: %v\n%s", err, out)
	}
	for _, cmd := range []string{"demo", "bench"} {
		_, errOut, err := run(t, cmd, "--rabbit-prefetch", "0")
		if err == nil || !strings.Contains(err.Error(), "--rabbit-prefetch must be 1 to 65535") ||
			!strings.Contains(errOut, "using the local development database") || !strings.Contains(errOut, "using the local development RabbitMQ") {
			t.Errorf("%s without settings: %v\n%s", cmd, err, errOut)
		}
	}
}
