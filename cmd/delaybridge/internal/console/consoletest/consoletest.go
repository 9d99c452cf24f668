// Package consoletest holds what the console's tests and the binary's
// tests of the console share: a known set of tasks, and a client that
// sends the console's credential.
package consoletest

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Topic is the topic of most tasks Schedule makes.
const Topic = "console-e2e"

// User and Password are the console credential the tests serve with.
const (
	User     = "ops"
	Password = "correct-horse-battery-staple"
)

// Schedule schedules a known set of tasks in db, makes one dead and one
// done, counts them as the daemon's background count would, and returns
// their ids by key.
func Schedule(t testing.TB, db *sql.DB) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	ids := map[string]int64{}
	for _, task := range []outbox.Task{
		{Topic: Topic, Key: "k-soon-1", DueAt: now.Add(10 * time.Minute), Payload: []byte(`{"order":"secret-1"}`)},
		{Topic: Topic, Key: "k-soon-2", DueAt: now.Add(25 * time.Minute)},
		{Topic: Topic, Key: "k-later", DueAt: now.Add(3 * time.Hour), Payload: []byte(`{"order":"secret-later"}`)},
		{Topic: Topic, Key: "k-dead", DueAt: now.Add(-5 * time.Minute)},
		{Topic: Topic, Key: "k-done", DueAt: now.Add(-10 * time.Minute)},
		{Topic: "console-other", Key: "o-1", DueAt: now.Add(2 * time.Hour)},
	} {
		id, err := outbox.Schedule(ctx, db, task)
		if err != nil {
			t.Fatal(err)
		}
		ids[task.Key] = id
	}
	testenv.MustExec(t, db, "UPDATE delay_task SET state = 'dead', last_error = 'handler gave up after 5 attempts: boom' WHERE id = ?", ids["k-dead"])
	testenv.MustExec(t, db, "UPDATE delay_task SET state = 'done', published_ms = due_ms - 60000, done_ms = due_ms + 1500 WHERE id = ?", ids["k-done"])
	if err := outbox.RefreshStats(ctx, db, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return ids
}

// Client sends requests to the console at URL as a browser would.
type Client struct {
	URL string
}

// Post sends a form as the browser would, with or without the credential.
func (c Client) Post(t testing.TB, path string, form url.Values, auth bool) (int, string) {
	t.Helper()
	return c.Do(t, http.MethodPost, path, strings.NewReader(form.Encode()), auth)
}

// Get reads path with the credential.
func (c Client) Get(t testing.TB, path string) (int, string) {
	t.Helper()
	return c.Do(t, http.MethodGet, path, nil, true)
}

// Do sends one request and returns the answer's status and body.
func (c Client) Do(t testing.TB, method, path string, body io.Reader, auth bool) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, c.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if auth {
		req.SetBasicAuth(User, Password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

var csrfInput = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// Token is a CSRF token the console issued to User, read from the form of
// its brokers page.
func (c Client) Token(t testing.TB) string {
	t.Helper()
	code, page := c.Get(t, "/brokers")
	m := csrfInput.FindStringSubmatch(page)
	if code != http.StatusOK || m == nil {
		t.Fatalf("GET /brokers: %d, no CSRF token in the page:\n%s", code, page)
	}
	return m[1]
}
