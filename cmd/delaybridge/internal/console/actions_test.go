package console

import (
	"context"
	"encoding/hex"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// hiddenField matches the hidden inputs of the confirmation form.
var hiddenField = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// confirmForm is what the confirmation page's form sends back.
func confirmForm(t *testing.T, page string) url.Values {
	t.Helper()
	form := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(page, -1) {
		form.Add(html.UnescapeString(m[1]), html.UnescapeString(m[2]))
	}
	if form.Get("confirm") != "yes" || form.Get(csrfField) == "" {
		t.Fatalf("no confirmation form in the page:\n%s", page)
	}
	return form
}

// A relative time is read once, on the first POST: the confirmation shows
// the absolute time it makes, and confirming writes exactly that time, however
// long the operator took; one that has passed meanwhile is written as any
// past time is.
func TestConsole_RescheduleConfirmWritesTheTimeItShowed(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	b := setupConsole(t, false)
	var mu sync.Mutex
	now := time.Now()
	b.c.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	later := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	path := fmt.Sprintf("/tasks/%d/reschedule", b.ids["k-later"])

	for _, tc := range []struct {
		when string
		in   time.Duration // from the first POST to the shown time
		wait time.Duration // before the operator confirms
	}{
		{"+30m", 30 * time.Minute, 7 * time.Minute},
		{"+1m", time.Minute, 5 * time.Minute}, // past when confirmed
	} {
		shown := b.c.now().Add(tc.in)
		code, page := b.Post(t, path, url.Values{"when": {tc.when}, csrfField: {b.c.csrf.token("ops")}}, true)
		if code != http.StatusOK || !strings.Contains(page, "to "+fmtTime(shown)) {
			t.Fatalf("%s: confirmation %d, want it to show %s:\n%s", tc.when, code, fmtTime(shown), page)
		}
		form := confirmForm(t, page)
		later(tc.wait)
		if code, body := b.Post(t, path, form, true); code != http.StatusOK || !strings.Contains(body, "Rescheduled") {
			t.Fatalf("%s: confirm (when=%q) %d:\n%s", tc.when, form.Get("when"), code, body)
		}
		st, due := b.state(t, "k-later")
		if st != outbox.StatePending || due != shown.UnixMilli() {
			t.Errorf("%s confirmed %v later: %s due %s, want pending due %s as shown (confirm sent when=%q)",
				tc.when, tc.wait, st, fmtTime(time.UnixMilli(due)), fmtTime(shown), form.Get("when"))
		}
	}
}

// nextLink finds the "next page" link of a console page.
var nextLink = regexp.MustCompile(`href="(/(?:tasks|dead)\?[^"]*after=[^"]*)"`)

// A search's next-page link carries no task key: the cursor of a search by
// topic is the last key of its page, and the link is sealed so neither the
// page, the browser's history nor a proxy's log holds it. The link still
// leads to the next page, and an altered one is refused.
func TestConsole_NextPageLinksHoldNoKey(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	b := setupConsole(t, false)
	keys, link := b.pagedSearch(t, "paged-secret")
	for _, k := range keys {
		if strings.Contains(link, hex.EncodeToString([]byte(k))) || strings.Contains(link, k) {
			t.Fatalf("the next-page link %q holds the key %s", link, k)
		}
	}
	code, second := b.Get(t, link)
	if code != http.StatusOK || !strings.Contains(second, fmt.Sprintf("/tasks/%d", b.taskID(t, keys[59]))) {
		t.Fatalf("the next-page link gave %d without the last task:\n%s", code, second)
	}
	u, err := url.Parse(link)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("after", "k:"+hex.EncodeToString([]byte(keys[10])))
	if code, body := b.Get(t, "/tasks?"+q.Encode()); code != http.StatusBadRequest || !strings.Contains(body, "start the search again") {
		t.Fatalf("a hand-made cursor: %d, want 400:\n%s", code, body)
	}
	// The dead page's redirect counts show as numbers only.
	code, dead := b.Get(t, "/dead?replayed=0.+Database+compromised&failed=call+us")
	if code != http.StatusOK || strings.Contains(dead, "compromised") || strings.Contains(dead, "call us") {
		t.Fatalf("the dead page repeats the URL's words (%d):\n%s", code, dead)
	}
}

// pagedSearch schedules 60 tasks of topic "paged" with keys prefix-000 to
// prefix-059 and returns them with the next-page link of the first page of
// the search by that topic.
func (b *consoleBundle) pagedSearch(t *testing.T, prefix string) (keys []string, link string) {
	t.Helper()
	for i := range 60 {
		key := fmt.Sprintf("%s-%03d", prefix, i)
		keys = append(keys, key)
		if _, err := outbox.Schedule(context.Background(), b.db, outbox.Task{Topic: "paged", Key: key, DueAt: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	code, page := b.Get(t, "/tasks?topic=paged")
	m := nextLink.FindStringSubmatch(page)
	if code != http.StatusOK || m == nil {
		t.Fatalf("first page %d without a next link:\n%s", code, page)
	}
	return keys, html.UnescapeString(m[1])
}

// taskID reads the id of the task with key.
func (b *consoleBundle) taskID(t *testing.T, key string) int64 {
	t.Helper()
	var id int64
	if err := b.db.QueryRow("SELECT id FROM delay_task WHERE task_key = ?", key).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// A genuine next-page link of a search by topic, reused in a search that
// pages in due order (a state filter, or the dead list), is refused without
// showing what the cursor holds: the last key of the page, which the
// console shows only when asked (and logs).
func TestConsole_ACursorFromAnotherSearchShowsNoKey(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	b := setupConsole(t, false)
	keys, link := b.pagedSearch(t, "cursor-secret")
	u, err := url.Parse(link)
	if err != nil {
		t.Fatal(err)
	}
	after := u.Query().Get("after")
	for _, path := range []string{
		"/tasks?" + url.Values{"topic": {"paged"}, "state": {"pending"}, "after": {after}}.Encode(),
		"/tasks?" + url.Values{"after": {after}}.Encode(),
		"/dead?" + url.Values{"after": {after}}.Encode(),
	} {
		code, body := b.Get(t, path)
		if code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", path, code)
		}
		for _, k := range keys {
			if strings.Contains(body, hex.EncodeToString([]byte(k))) || strings.Contains(body, k) {
				t.Fatalf("%s shows the key %s:\n%s", path, k, body)
			}
		}
	}
}

// The lists' attempts column shows the handler's attempts beside the
// relay's publishes: a task the consumer gave up on after 5 handler
// attempts, published once, reads "5 / 1", on the dead list and in a
// search.
func TestConsole_ListsShowHandlerAndPublishAttempts(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	b := setupConsole(t, false)
	testenv.MustExec(t, b.db, "UPDATE delay_task SET attempts = 5, publish_attempts = 1 WHERE id = ?", b.ids["k-dead"])
	row := regexp.MustCompile(fmt.Sprintf(`(?s)data-id="%d".*?</tr>`, b.ids["k-dead"]))
	for _, path := range []string{"/dead", "/tasks?" + url.Values{"topic": {consoleTopic}, "state": {"dead"}}.Encode()} {
		code, page := b.Get(t, path)
		tr := row.FindString(page)
		if code != http.StatusOK || !strings.Contains(tr, `<td class="n">5 / 1</td>`) {
			t.Errorf("%s (%d): the dead task's row %q does not read 5 handler / 1 publish attempts", path, code, tr)
		}
	}
}

// Before any background count, the overview and the dead list say the
// dead tasks are not counted rather than show 0 beside a dead task.
func TestConsole_DeadNotCountedYetIsNotZero(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	b := setupConsole(t, false)
	testenv.MustExec(t, b.db, "DELETE FROM delay_task_stats")
	testenv.MustExec(t, b.db, "DELETE FROM delay_task_stats_run")
	code, page := b.Get(t, "/")
	if code != http.StatusOK || !strings.Contains(page, `id="dead-count">?</span> dead (not counted yet`) {
		t.Errorf("overview (%d) without a count:\n%s", code, page)
	}
	code, page = b.Get(t, "/dead")
	if code != http.StatusOK || strings.Contains(page, `id="dead-total"`) || !strings.Contains(page, "not counted yet") ||
		!strings.Contains(page, fmt.Sprintf(`data-id="%d"`, b.ids["k-dead"])) {
		t.Errorf("dead list (%d) without a count:\n%s", code, page)
	}
}
