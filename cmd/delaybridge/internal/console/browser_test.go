package console

import (
	"context"
	"database/sql"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/console/consoletest"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// consoleBundle is a console over a migrated scratch database, served by
// an httptest server, with its log captured.
type consoleBundle struct {
	consoletest.Client
	db   *sql.DB
	c    *console
	srv  *httptest.Server
	logs *testenv.SyncBuffer
	ids  map[string]int64
}

const consoleTopic = consoletest.Topic

// setupConsole schedules a known set of tasks, counts them as the daemon's
// background count would, and serves a console over them.
func setupConsole(t *testing.T, readOnly bool) *consoleBundle {
	t.Helper()
	db, dsn := scratch(t)
	ids := consoletest.Schedule(t, db)
	b := serveConsole(t, dsn, []*Shard{{dsn: dsn, db: db}}, Options{readOnly: readOnly, grace: 30 * time.Second, probe: 2 * time.Second}, testenv.RabbitFlags(t)...)
	b.db, b.ids = db, ids
	return b
}

func (b *consoleBundle) state(t *testing.T, key string) (outbox.State, int64) {
	t.Helper()
	var st string
	var due int64
	if err := b.db.QueryRow("SELECT state, due_ms FROM delay_task WHERE id = ?", b.ids[key]).Scan(&st, &due); err != nil {
		t.Fatal(err)
	}
	return outbox.State(strings.TrimSpace(st)), due
}

// browser starts headless Chromium (Debian's chromium package, installed by
// scripts/tools.sh) that sends the console's credential with every request.
func browser(t *testing.T) context.Context {
	t.Helper()
	testenv.SkipIfShort(t, "starts Chromium against MariaDB")
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("chromium not found (scripts/tools.sh installs it): %v", err)
		}
		t.Skipf("chromium not found (scripts/tools.sh installs it): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.Flag("disable-gpu", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:"+testConsolePassword))
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}}); err != nil {
		t.Fatal(err)
	}
	return ctx
}

func text(t *testing.T, ctx context.Context, id string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID(id)))
	if err != nil {
		t.Fatalf("text of #%s: %v", id, err)
	}
	return strings.TrimSpace(s)
}

// navigate goes to path and requires a 200.
func navigate(t *testing.T, ctx context.Context, b *consoleBundle, path string) {
	t.Helper()
	resp, err := chromedp.RunResponse(ctx, chromedp.Navigate(b.srv.URL+path))
	if err != nil {
		t.Fatalf("navigate %s: %v", path, err)
	}
	if resp.Status != http.StatusOK {
		t.Fatalf("navigate %s: status %d", path, resp.Status)
	}
}

// submit clicks the button with id and waits for the page it leads to.
func submit(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.ID(id)))
	if err != nil {
		t.Fatalf("click #%s: %v", id, err)
	}
	if resp.Status != http.StatusOK {
		t.Fatalf("click #%s: status %d", id, resp.Status)
	}
}

func TestConsole_InABrowser_ShowsCountsFindsTasksAndActs(t *testing.T) {
	b := setupConsole(t, false)
	ctx := browser(t)

	// Overview: the counts of what was scheduled.
	navigate(t, ctx, b, "/")
	for id, want := range map[string]string{
		"backlog-" + consoleTopic + "-pending": "3",
		"backlog-" + consoleTopic + "-dead":    "1",
		"backlog-console-other-pending":        "1",
		"dead-count":                           "1",
		"done-count":                           "1",
		"due-total":                            "2",
		"late-p50":                             "1500",
		"rescue-done-sampled":                  "1",
	} {
		if got := text(t, ctx, id); got != want {
			t.Errorf("overview #%s = %q, want %q", id, got, want)
		}
	}

	// Search by topic and key: exactly the one task, its key hidden.
	navigate(t, ctx, b, "/tasks")
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("topic"), consoleTopic), chromedp.SetValue(chromedp.ID("key"), "k-soon-2")); err != nil {
		t.Fatal(err)
	}
	submit(t, ctx, "search-button")
	rows, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSSAll("tr.task")))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("search found %d rows, want 1", len(rows))
	}
	if got := text(t, ctx, "results"); !strings.Contains(got, strconv.FormatInt(b.ids["k-soon-2"], 10)) || strings.Contains(got, "k-soon-2") {
		t.Fatalf("search results %q: want task %d with its key hidden", got, b.ids["k-soon-2"])
	}

	// Open it and cancel it, through the confirmation.
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS("a.task-link")))
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("open the task: %v %v", resp, err)
	}
	if got := text(t, ctx, "state"); got != "pending" {
		t.Fatalf("task state %q, want pending", got)
	}
	if got := text(t, ctx, "key"); strings.Contains(got, "k-soon-2") || !strings.Contains(got, "hidden") {
		t.Fatalf("key shown without a reveal: %q", got)
	}
	submit(t, ctx, "cancel-button")
	if got := text(t, ctx, "confirm-question"); !strings.Contains(got, fmt.Sprintf("Cancel task %d?", b.ids["k-soon-2"])) {
		t.Fatalf("confirmation %q", got)
	}
	if st, _ := b.state(t, "k-soon-2"); st != outbox.StatePending {
		t.Fatalf("state %s after the first click: the confirmation must come first", st)
	}
	submit(t, ctx, "confirm-button")
	if got := text(t, ctx, "state"); got != "cancelled" {
		t.Errorf("page state after cancel %q", got)
	}
	if st, _ := b.state(t, "k-soon-2"); st != outbox.StateCancelled {
		t.Errorf("database state after cancel %s", st)
	}

	// Reschedule k-soon-1 three hours ahead.
	navigate(t, ctx, b, fmt.Sprintf("/tasks/%d", b.ids["k-soon-1"]))
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("when"), "+3h")); err != nil {
		t.Fatal(err)
	}
	asked := time.Now()
	submit(t, ctx, "reschedule-button")
	submit(t, ctx, "confirm-button")
	_, dueMS := b.state(t, "k-soon-1")
	due := time.UnixMilli(dueMS)
	if due.Before(asked.Add(3*time.Hour-time.Minute)) || due.After(time.Now().Add(3*time.Hour+time.Minute)) {
		t.Errorf("database due %v after reschedule +3h at %v", due, asked)
	}
	if got := text(t, ctx, "due"); !strings.Contains(got, fmtTime(due)) {
		t.Errorf("page due %q, want %s", got, fmtTime(due))
	}
	if got := text(t, ctx, "flash"); !strings.Contains(got, "Rescheduled") {
		t.Errorf("flash %q", got)
	}

	// Replay the dead task from the dead list.
	navigate(t, ctx, b, "/dead")
	if got := text(t, ctx, "dead"); !strings.Contains(got, "boom") {
		t.Errorf("dead list %q lacks the reason", got)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID(fmt.Sprintf("pick-%d", b.ids["k-dead"])))); err != nil {
		t.Fatal(err)
	}
	submit(t, ctx, "replay-selected")
	if got := text(t, ctx, "confirm-question"); !strings.Contains(got, "Replay 1 dead task(s)?") {
		t.Fatalf("confirmation %q", got)
	}
	submit(t, ctx, "confirm-button")
	if got := text(t, ctx, "flash"); !strings.Contains(got, "Replayed 1 task(s)") {
		t.Errorf("flash after replay %q", got)
	}
	if got := text(t, ctx, "no-dead"); got != "no dead tasks" {
		t.Errorf("dead list after replay %q", got)
	}
	if st, _ := b.state(t, "k-dead"); st != outbox.StatePending {
		t.Errorf("database state after replay %s", st)
	}

	// A reveal shows the key and payload, and is logged.
	navigate(t, ctx, b, fmt.Sprintf("/tasks/%d?reveal=1", b.ids["k-later"]))
	if got := text(t, ctx, "key"); got != "k-later" {
		t.Errorf("revealed key %q", got)
	}
	if got := text(t, ctx, "payload"); got != `{"order":"secret-later"}` {
		t.Errorf("revealed payload %q", got)
	}
	logs := b.logs.String()
	for _, want := range []string{
		`msg="console: revealed a task's key and payload" who=ops remote=127.0.0.1`,
		`msg="console: action done" who=ops remote=127.0.0.1`,
		fmt.Sprintf("action=cancel id=%d topic=%s", b.ids["k-soon-2"], consoleTopic),
		fmt.Sprintf("action=reschedule id=%d", b.ids["k-soon-1"]),
		fmt.Sprintf("action=replay id=%d", b.ids["k-dead"]),
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "k-later") || strings.Contains(logs, "secret") {
		t.Errorf("the log holds a key or a payload:\n%s", logs)
	}

	// Brokers: the limits in effect, and doctor's checks run from the page.
	navigate(t, ctx, b, "/brokers")
	if got := text(t, ctx, "limits"); !strings.Contains(got, "max delay per hop") || !strings.Contains(got, "ladder") {
		t.Errorf("limits %q", got)
	}
	submit(t, ctx, "doctor-button")
	// The check below says what is missing if doctor is still running.
	testutil.Eventually(90*time.Second, 200*time.Millisecond, func() bool { return !b.c.lastDoctor().Running })
	navigate(t, ctx, b, "/brokers")
	if got := text(t, ctx, "doctor"); !strings.Contains(got, doctorRanCheck) {
		t.Errorf("doctor's checks %q", got)
	}
}

func TestConsole_RefusesRequestsWithoutCredentialAndActionsWithoutToken(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	b := setupConsole(t, false)
	later := fmt.Sprintf("/tasks/%d", b.ids["k-later"])

	if code, body := b.Do(t, http.MethodGet, later+"?reveal=1", nil, false); code != http.StatusUnauthorized || strings.Contains(body, "k-later") {
		t.Fatalf("GET without the credential: %d %q", code, body)
	}
	if code, _ := b.Post(t, later+"/cancel", url.Values{"confirm": {"yes"}, csrfField: {b.c.csrf.token("ops")}}, false); code != http.StatusUnauthorized {
		t.Errorf("POST without the credential: %d", code)
	}
	if code, _ := b.Post(t, later+"/cancel", url.Values{"confirm": {"yes"}}, true); code != http.StatusForbidden {
		t.Errorf("POST without the CSRF token: %d", code)
	}
	if code, _ := b.Post(t, later+"/cancel", url.Values{"confirm": {"yes"}, csrfField: {"1700000000.forged"}}, true); code != http.StatusForbidden {
		t.Errorf("POST with a forged CSRF token: %d", code)
	}
	if st, _ := b.state(t, "k-later"); st != outbox.StatePending {
		t.Fatalf("a refused action changed the task: %s", st)
	}
	// Bad input changes nothing either.
	if code, _ := b.Post(t, later+"/reschedule", url.Values{"confirm": {"yes"}, "when": {"tomorrow"}, csrfField: {b.c.csrf.token("ops")}}, true); code != http.StatusBadRequest {
		t.Errorf("reschedule to a malformed time: %d", code)
	}
	if code, body := b.Post(t, fmt.Sprintf("/tasks/%d/replay", b.ids["k-later"]), url.Values{"confirm": {"yes"}, csrfField: {b.c.csrf.token("ops")}}, true); code != http.StatusConflict || strings.Contains(body, "k-later") {
		t.Errorf("replay of a pending task: %d %q", code, body)
	}
	// The outbox's error names the task by topic/key; the log must not.
	if logs := b.logs.String(); !strings.Contains(logs, "console: action failed") || !strings.Contains(logs, "not dead") || strings.Contains(logs, "k-later") {
		t.Errorf("the failed replay's log line is missing or names the key:\n%s", logs)
	}
	if code, _ := b.Get(t, "/tasks?key=k-later"); code != http.StatusBadRequest {
		t.Errorf("key search without a topic: %d", code)
	}
	if st, _ := b.state(t, "k-later"); st != outbox.StatePending {
		t.Fatalf("bad input changed the task: %s", st)
	}
	// With the token, the same action works.
	if code, _ := b.Post(t, later+"/cancel", url.Values{"confirm": {"yes"}, csrfField: {b.c.csrf.token("ops")}}, true); code != http.StatusOK {
		t.Errorf("POST with credential and token: %d", code)
	}
	if st, _ := b.state(t, "k-later"); st != outbox.StateCancelled {
		t.Errorf("state after an accepted cancel: %s", st)
	}
}

func TestConsole_ReadOnlyShowsNoActionsAndRefusesThem(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	b := setupConsole(t, true)
	later := fmt.Sprintf("/tasks/%d", b.ids["k-later"])
	code, body := b.Get(t, later)
	if code != http.StatusOK || strings.Contains(body, "cancel-form") || !strings.Contains(body, "read-only") {
		t.Fatalf("read-only task page: %d, actions shown or no read-only mark", code)
	}
	for _, action := range []string{"cancel", "reschedule", "replay"} {
		if code, _ := b.Post(t, later+"/"+action, url.Values{"confirm": {"yes"}, "when": {"+1h"}, csrfField: {b.c.csrf.token("ops")}}, true); code != http.StatusForbidden {
			t.Errorf("read-only %s: %d", action, code)
		}
	}
	if code, _ := b.Post(t, "/dead/replay", url.Values{"confirm": {"yes"}, "id": {strconv.FormatInt(b.ids["k-dead"], 10)}, csrfField: {b.c.csrf.token("ops")}}, true); code != http.StatusForbidden {
		t.Errorf("read-only dead replay: %d", code)
	}
	if st, _ := b.state(t, "k-later"); st != outbox.StatePending {
		t.Errorf("read-only console changed a task: %s", st)
	}
	if st, _ := b.state(t, "k-dead"); st != outbox.StateDead {
		t.Errorf("read-only console replayed a task: %s", st)
	}
	if !strings.Contains(b.logs.String(), "refused an action in read-only mode") {
		t.Error("refusals not logged")
	}
}
