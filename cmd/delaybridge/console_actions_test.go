package main

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/outbox"
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
		code, page := b.post(t, path, url.Values{"when": {tc.when}, csrfField: {b.c.csrf.token("ops")}}, true)
		if code != http.StatusOK || !strings.Contains(page, "to "+fmtTime(shown)) {
			t.Fatalf("%s: confirmation %d, want it to show %s:\n%s", tc.when, code, fmtTime(shown), page)
		}
		form := confirmForm(t, page)
		later(tc.wait)
		if code, body := b.post(t, path, form, true); code != http.StatusOK || !strings.Contains(body, "Rescheduled") {
			t.Fatalf("%s: confirm (when=%q) %d:\n%s", tc.when, form.Get("when"), code, body)
		}
		st, due := b.state(t, "k-later")
		if st != outbox.StatePending || due != shown.UnixMilli() {
			t.Errorf("%s confirmed %v later: %s due %s, want pending due %s as shown (confirm sent when=%q)",
				tc.when, tc.wait, st, fmtTime(time.UnixMilli(due)), fmtTime(shown), form.Get("when"))
		}
	}
}
