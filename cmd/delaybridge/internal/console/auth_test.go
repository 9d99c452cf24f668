package console

import (
	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/console/consoletest"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const testConsolePassword = consoletest.Password

func TestConsoleCredential_ParsesUserPasswordAndRefusesWeakOrMalformedLines(t *testing.T) {
	good, err := parseCredential("ops:"+testConsolePassword, "f")
	if err != nil || good.user != "ops" || good.password != testConsolePassword {
		t.Fatalf("good line: %+v, %v", good, err)
	}
	// A colon inside the password is the password's.
	if c, err := parseCredential("ops:a:b-long-enough-password", "f"); err != nil || c.password != "a:b-long-enough-password" {
		t.Fatalf("colon in password: %+v, %v", c, err)
	}
	for _, line := range []string{"ops", ":" + testConsolePassword, "ops:", "ops:short", "o ps:" + testConsolePassword, "o\x01:" + testConsolePassword} {
		if _, err := parseCredential(line, "f"); err == nil {
			t.Errorf("%q accepted", line)
		} else if strings.Contains(err.Error(), testConsolePassword) {
			t.Errorf("%q: the error quotes the password: %v", line, err)
		}
	}
}

func TestConsoleCredential_ReadsTheFileLikeEverySecret(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "auth")
	if _, err := readCredential(""); err == nil || !strings.Contains(err.Error(), "--auth-file is required") {
		t.Fatalf("no file: %v", err)
	}
	if _, err := readCredential(path); err == nil {
		t.Fatal("a missing file was accepted")
	}
	if err := os.WriteFile(path, []byte("ops:"+testConsolePassword+"\nother:"+testConsolePassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readCredential(path); err == nil || strings.Contains(err.Error(), testConsolePassword) {
		t.Fatalf("two lines: %v", err)
	}
	if err := os.WriteFile(path, []byte("ops:"+testConsolePassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := readCredential(path)
	if err != nil || c.user != "ops" || c.password != testConsolePassword {
		t.Fatalf("good file: %+v, %v", c, err)
	}
}

func TestConsoleCredential_CheckNeedsBothParts(t *testing.T) {
	c := credential{user: "ops", password: testConsolePassword}
	for _, tc := range []struct {
		name       string
		user, pass string
		set        bool
		want       bool
	}{
		{"right", "ops", testConsolePassword, true, true},
		{"wrong password", "ops", testConsolePassword + "x", true, false},
		{"wrong user", "op", testConsolePassword, true, false},
		{"empty", "", "", true, false},
		{"none", "", "", false, false},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if tc.set {
			r.SetBasicAuth(tc.user, tc.pass)
		}
		if got := c.check(r); got != tc.want {
			t.Errorf("%s: check = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// guardedConsole is a console with only what guard uses, around a handler
// that answers 200 "ok".
func guardedConsole(t *testing.T) (*console, http.Handler) {
	t.Helper()
	cs, err := newCSRF(time.Now)
	if err != nil {
		t.Fatal(err)
	}
	c := &console{cred: credential{user: "ops", password: testConsolePassword}, csrf: cs, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	return c, c.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok "+who(r))
	}))
}

func TestConsoleGuard_RefusesWithoutCredentialOrTokenAndSetsHeaders(t *testing.T) {
	c, h := guardedConsole(t)
	serve := func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	authed := func(method, target string, form url.Values) *http.Request {
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		r := httptest.NewRequest(method, target, body)
		if form != nil {
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		r.SetBasicAuth("ops", testConsolePassword)
		return r
	}

	w := serve(httptest.NewRequest(http.MethodGet, "/", nil))
	if w.Code != http.StatusUnauthorized || !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Basic ") {
		t.Fatalf("no credential: %d %q", w.Code, w.Header().Get("WWW-Authenticate"))
	}
	w = serve(authed(http.MethodGet, "/", nil))
	if w.Code != http.StatusOK || w.Body.String() != "ok ops" {
		t.Fatalf("GET with credential: %d %q", w.Code, w.Body.String())
	}
	for _, hdr := range []string{"Content-Security-Policy", "X-Content-Type-Options", "X-Frame-Options", "Referrer-Policy", "Cache-Control"} {
		if w.Header().Get(hdr) == "" {
			t.Errorf("header %s missing", hdr)
		}
	}
	if w := serve(authed(http.MethodPost, "/tasks/1/cancel", url.Values{"confirm": {"yes"}})); w.Code != http.StatusForbidden {
		t.Errorf("POST without a CSRF token: %d", w.Code)
	}
	if w := serve(authed(http.MethodPost, "/tasks/1/cancel", url.Values{csrfField: {"1.bad"}})); w.Code != http.StatusForbidden {
		t.Errorf("POST with a bad CSRF token: %d", w.Code)
	}
	good := url.Values{csrfField: {c.csrf.token("ops")}}
	if w := serve(authed(http.MethodPost, "/tasks/1/cancel", good)); w.Code != http.StatusOK {
		t.Errorf("POST with a good token: %d %s", w.Code, w.Body.String())
	}
	cross := authed(http.MethodPost, "/tasks/1/cancel", good)
	cross.Header.Set("Sec-Fetch-Site", "cross-site")
	if w := serve(cross); w.Code != http.StatusForbidden {
		t.Errorf("cross-site POST with a good token: %d", w.Code)
	}
	noAuth := httptest.NewRequest(http.MethodPost, "/tasks/1/cancel", strings.NewReader(good.Encode()))
	noAuth.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if w := serve(noAuth); w.Code != http.StatusUnauthorized {
		t.Errorf("POST with a token but no credential: %d", w.Code)
	}
	if w := serve(authed(http.MethodPut, "/", nil)); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("PUT: %d", w.Code)
	}
	big := authed(http.MethodPost, "/dead/replay", url.Values{csrfField: {c.csrf.token("ops")}, "id": {strings.Repeat("1", maxForm)}})
	if w := serve(big); w.Code != http.StatusBadRequest {
		t.Errorf("oversized form: %d", w.Code)
	}
}
