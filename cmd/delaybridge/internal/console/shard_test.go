package console

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/console/consoletest"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// unreachableShard is a shard whose server refuses every connection: a
// pool on it opens, and every query fails at once.
func unreachableShard(t *testing.T, name string) *Shard {
	t.Helper()
	dsn := "delaybridge:secretpw@tcp(127.0.0.1:1)/delaybridge?timeout=2s"
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return &Shard{name: name, dsn: dsn, db: db}
}

// shardOpts are the options of the consoles of the shard tests.
var shardOpts = Options{grace: 30 * time.Second, probe: 2 * time.Second}

// serveConsole serves a console with opts over shards, its --mysql-dsn
// dsn, with the broker flags brokerArgs, logging into logs.
func serveConsole(t *testing.T, dsn string, shards []*Shard, opts Options, brokerArgs ...string) *consoleBundle {
	t.Helper()
	b := &consoleBundle{logs: &testenv.SyncBuffer{}, ids: map[string]int64{}}
	c, err := newConsole(testEnv(t, dsn, b.logs, brokerArgs...), shards, credential{user: "ops", password: testConsolePassword}, opts)
	if err != nil {
		t.Fatal(err)
	}
	b.c = c
	b.srv = httptest.NewServer(c.Handler())
	b.Client = consoletest.Client{URL: b.srv.URL}
	t.Cleanup(func() { b.srv.Close(); c.Close() })
	return b
}

func TestConsole_ShardRoutingRefusesUnknownAndMissingShards(t *testing.T) {
	b := serveConsole(t, "", []*Shard{unreachableShard(t, "eu-1"), unreachableShard(t, "eu-2")}, shardOpts, "--broker", "rabbit")
	token := b.c.csrf.token("ops")
	for _, tc := range []struct {
		method, path string
		status       int
		want         string
	}{
		{http.MethodGet, "/tasks/1", http.StatusBadRequest, "which shard? Task ids are per shard: add ?shard=NAME, one of eu-1, eu-2"},
		{http.MethodGet, "/tasks/1?shard=eu-3", http.StatusNotFound, "no shard &#34;eu-3&#34;: this console serves eu-1, eu-2"},
		{http.MethodGet, "/tasks?shard=eu-3", http.StatusNotFound, "no shard &#34;eu-3&#34;"},
		{http.MethodGet, "/dead?shard=%3Cb%3E", http.StatusNotFound, "no shard &#34;&lt;b&gt;&#34;"},
		{http.MethodPost, "/tasks/1/cancel", http.StatusBadRequest, "which shard?"},
		{http.MethodPost, "/tasks/1/cancel?shard=eu-3", http.StatusNotFound, "no shard &#34;eu-3&#34;"},
		{http.MethodPost, "/dead/replay?shard=eu-3", http.StatusNotFound, "no shard &#34;eu-3&#34;"},
		{http.MethodPost, "/dead/replay", http.StatusBadRequest, "which shard?"},
		// A known shard whose database is down: a 500 naming the shard,
		// the cause in the log only.
		{http.MethodGet, "/tasks/1?shard=eu-2", http.StatusInternalServerError, "shard eu-2: its database could not answer"},
	} {
		var code int
		var body string
		if tc.method == http.MethodPost {
			code, body = b.Post(t, tc.path, url.Values{"confirm": {"yes"}, "id": {"1"}, csrfField: {token}}, true)
		} else {
			code, body = b.Get(t, tc.path)
		}
		if code != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s %s: %d, want %d with %q in\n%s", tc.method, tc.path, code, tc.status, tc.want, body)
		}
	}
	if logs := b.logs.String(); strings.Contains(logs, "secretpw") || !strings.Contains(logs, "shard=eu-2") {
		t.Errorf("log shows a password or does not name the failing shard:\n%s", logs)
	}

	// The overview shows every shard down, with its error, and no password.
	code, body := b.Get(t, "/")
	if code != http.StatusOK {
		t.Fatalf("overview with every shard down: %d\n%s", code, body)
	}
	for _, want := range []string{`id="shard-eu-1-down"`, `id="shard-eu-2-down"`, `id="shards-up">0<`, "127.0.0.1:1", "xxxxx", "connection refused"} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	if strings.Contains(body, "secretpw") {
		t.Error("overview shows a shard's password")
	}

	// An unsharded console knows no shard names.
	one := serveConsole(t, "", []*Shard{{dsn: "u:p@tcp(127.0.0.1:1)/o", db: b.c.shards[0].db}}, shardOpts, "--broker", "rabbit")
	if code, body := one.Get(t, "/tasks?shard=eu-1"); code != http.StatusNotFound || !strings.Contains(body, "this console serves one outbox database, not shards") {
		t.Errorf("unsharded console with ?shard=: %d\n%s", code, body)
	}
}

func TestWithShard_AddsTheShardToAPath(t *testing.T) {
	for _, tc := range []struct{ path, name, want string }{
		{"/tasks", "", "/tasks"},
		{"/tasks", "eu-1", "/tasks?shard=eu-1"},
		{"/tasks/7?done=cancel", "eu_2", "/tasks/7?done=cancel&shard=eu_2"},
	} {
		if got := withShard(tc.path, tc.name); got != tc.want {
			t.Errorf("withShard(%q, %q) = %q, want %q", tc.path, tc.name, got, tc.want)
		}
	}
}

// shardDB is one shard of the sharded browser test.
type shardDB struct {
	db  *sql.DB
	ids map[string]int64
}

func (s *shardDB) state(t *testing.T, id int64) outbox.State {
	t.Helper()
	var st string
	if err := s.db.QueryRow("SELECT state FROM delay_task WHERE id = ?", id).Scan(&st); err != nil {
		t.Fatalf("task %d: %v", id, err)
	}
	return outbox.State(strings.TrimSpace(st))
}

// newShardDB schedules tasks with keys, all pending and due later, then
// kills the ones named dead, and counts them as the daemon would.
func newShardDB(t *testing.T, db *sql.DB, keys []string, dead ...string) *shardDB {
	t.Helper()
	ctx := context.Background()
	s := &shardDB{db: db, ids: map[string]int64{}}
	for i, k := range keys {
		id, err := outbox.Schedule(ctx, s.db, outbox.Task{Topic: consoleTopic, Key: k, DueAt: time.Now().Add(2*time.Hour + time.Duration(i)*time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		s.ids[k] = id
	}
	for _, k := range dead {
		testenv.MustExec(t, s.db, "UPDATE delay_task SET state = 'dead', last_error = 'handler gave up: boom' WHERE id = ?", s.ids[k])
	}
	if err := outbox.RefreshStats(ctx, s.db, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestConsole_InABrowser_ServesEachShardOnItsOwnDatabase runs the console
// over two outbox shards on two MariaDB servers (the second started by
// scripts/cluster.sh shard for this test) and a third shard that is down.
func TestConsole_InABrowser_ServesEachShardOnItsOwnDatabase(t *testing.T) {
	testenv.SkipIfShort(t, "starts a second MariaDB server and Chromium")
	t.Setenv("DELAYBRIDGE_MYSQL_DSN", "")
	dbA, dsnA := scratch(t)
	dbB, dsnB := testenv.ScratchDBAt(t, testenv.Shard2(t))
	if _, err := outbox.Migrate(context.Background(), dbB); err != nil {
		t.Fatal(err)
	}
	// Ids start at 1 in both databases, so the same id names a different
	// task in each shard: an action on the wrong shard would show.
	a := newShardDB(t, dbA, []string{"a-1", "a-2", "a-3"}, "a-3")
	b := newShardDB(t, dbB, []string{"b-1", "b-2", "b-3", "b-4", "only-b"}, "b-4")
	if a.ids["a-2"] != b.ids["b-2"] {
		t.Fatalf("ids a-2=%d b-2=%d: want the same id in both shards", a.ids["a-2"], b.ids["b-2"])
	}

	// The shards as the binary opens them from --shard a=DSN b=DSN c=DSN
	// (its tests cover the flags): pools that connect when used, c's on a
	// server that refuses every connection.
	con := serveConsole(t, "", []*Shard{{name: "a", dsn: dsnA, db: dbA}, {name: "b", dsn: dsnB, db: dbB}, unreachableShard(t, "c")}, shardOpts, testenv.RabbitFlags(t)...)
	ctx := browser(t)

	// Overview: each shard's counts under its name, the totals, and shard c
	// down with its error and no password.
	navigate(t, ctx, con, "/")
	for id, want := range map[string]string{
		"shard-a-backlog-" + consoleTopic + "-pending": "2",
		"shard-a-backlog-" + consoleTopic + "-dead":    "1",
		"shard-b-backlog-" + consoleTopic + "-pending": "4",
		"shard-b-backlog-" + consoleTopic + "-dead":    "1",
		"shard-a-dead-count":                           "1",
		"shard-b-dead-count":                           "1",
		"total-backlog-" + consoleTopic + "-pending":   "6",
		"total-dead-count":                             "2",
		"shards-up":                                    "2",
		"shards-down":                                  "1 down",
		"shard-c-down":                                 "down",
	} {
		if got := text(t, ctx, id); got != want {
			t.Errorf("overview #%s = %q, want %q", id, got, want)
		}
	}
	if got := text(t, ctx, "shard-c-error"); !strings.Contains(got, "127.0.0.1:1") || strings.Contains(got, "secretpw") {
		t.Errorf("shard c's error %q: want its address and no password", got)
	}

	// Search: the key is found in its own shard only.
	navigate(t, ctx, con, "/tasks?shard=a")
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("topic"), consoleTopic), chromedp.SetValue(chromedp.ID("key"), "only-b")); err != nil {
		t.Fatal(err)
	}
	submit(t, ctx, "search-button")
	if got := text(t, ctx, "no-results"); got != "no task matches" {
		t.Fatalf("search of shard a for only-b: %q", got)
	}
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("shard"), "b")); err != nil {
		t.Fatal(err)
	}
	submit(t, ctx, "search-button")
	rows, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSSAll("tr.task")))
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, ctx, "shard-name"); len(rows) != 1 || got != "b" {
		t.Fatalf("search of shard b for only-b: %d rows on shard %q, want 1 on b", len(rows), got)
	}

	// Cancel b-2 from its page: shard b's row changes, shard a's row of the
	// same id does not.
	navigate(t, ctx, con, fmt.Sprintf("/tasks/%d?shard=b", b.ids["b-2"]))
	if got := text(t, ctx, "task-shard"); got != "b" {
		t.Fatalf("task page shard %q", got)
	}
	submit(t, ctx, "cancel-button")
	if got := text(t, ctx, "confirm-question"); !strings.Contains(got, fmt.Sprintf("Cancel task %d in shard b?", b.ids["b-2"])) {
		t.Fatalf("confirmation %q", got)
	}
	submit(t, ctx, "confirm-button")
	if got := text(t, ctx, "state"); got != "cancelled" {
		t.Errorf("page state after cancel %q", got)
	}
	if st := b.state(t, b.ids["b-2"]); st != outbox.StateCancelled {
		t.Errorf("shard b's task after cancel: %s", st)
	}
	if st := a.state(t, a.ids["a-2"]); st != outbox.StatePending {
		t.Errorf("shard a's task of the same id after a cancel on shard b: %s", st)
	}

	// Replay shard b's dead task from its dead list; shard a's stays dead.
	navigate(t, ctx, con, "/dead?shard=b")
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("pick-"+strconv.FormatInt(b.ids["b-4"], 10)))); err != nil {
		t.Fatal(err)
	}
	submit(t, ctx, "replay-selected")
	submit(t, ctx, "confirm-button")
	if got := text(t, ctx, "flash"); !strings.Contains(got, "Replayed 1 task(s)") {
		t.Errorf("flash after replay %q", got)
	}
	if st := b.state(t, b.ids["b-4"]); st != outbox.StatePending {
		t.Errorf("shard b's dead task after replay: %s", st)
	}
	if st := a.state(t, a.ids["a-3"]); st != outbox.StateDead {
		t.Errorf("shard a's dead task after a replay on shard b: %s", st)
	}
	navigate(t, ctx, con, "/dead?shard=a")
	if got := text(t, ctx, "dead"); !strings.Contains(got, strconv.FormatInt(a.ids["a-3"], 10)) || !strings.Contains(got, "boom") {
		t.Errorf("shard a's dead list %q", got)
	}

	logs := con.logs.String()
	for _, want := range []string{
		`msg="console: action done" shard=b who=ops remote=127.0.0.1`,
		fmt.Sprintf("action=cancel id=%d topic=%s", b.ids["b-2"], consoleTopic),
		fmt.Sprintf("action=replay id=%d", b.ids["b-4"]),
		`msg="console: a shard could not be read for the overview" shard=c`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "secretpw") {
		t.Errorf("the log shows a password:\n%s", logs)
	}
	if code, _ := con.Get(t, fmt.Sprintf("/tasks/%d?shard=nope", b.ids["b-2"])); code != http.StatusNotFound {
		t.Errorf("unknown shard: %d, want 404", code)
	}

	// Doctor's checks from the brokers page cover every shard by name.
	navigate(t, ctx, con, "/brokers")
	submit(t, ctx, "doctor-button")
	deadline := time.Now().Add(90 * time.Second)
	for con.c.lastDoctor().Running && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	navigate(t, ctx, con, "/brokers")
	got := text(t, ctx, "doctor")
	for _, want := range []string{doctorRanCheck} {
		if !strings.Contains(got, want) {
			t.Errorf("doctor's checks lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "secretpw") {
		t.Errorf("doctor's checks show a password:\n%s", got)
	}
}
