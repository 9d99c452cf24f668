package console

import (
	"fmt"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// loginBundle is a guarded console on a clock the test moves.
type loginBundle struct {
	mu   sync.Mutex
	now  time.Time
	logs *testenv.SyncBuffer
	h    http.Handler
}

func setupLogins(t *testing.T) *loginBundle {
	t.Helper()
	b := &loginBundle{now: time.Unix(1_800_000_000, 0), logs: &testenv.SyncBuffer{}}
	log := slog.New(slog.NewTextHandler(b.logs, nil))
	c := &console{cred: credential{user: "ops", password: testConsolePassword}, log: log}
	c.logins = newLoginThrottle(b.clock, log)
	c.csrf, _ = newCSRF(b.clock)
	b.h = c.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	return b
}

func (b *loginBundle) clock() time.Time     { b.mu.Lock(); defer b.mu.Unlock(); return b.now }
func (b *loginBundle) wait(d time.Duration) { b.mu.Lock(); defer b.mu.Unlock(); b.now = b.now.Add(d) }

// login sends GET / from remote with password and returns the status and
// the Retry-After it was told, in seconds.
func (b *loginBundle) login(remote, password string) (int, int) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	r.SetBasicAuth("ops", password)
	w := httptest.NewRecorder()
	b.h.ServeHTTP(w, r)
	after, _ := strconv.Atoi(w.Header().Get("Retry-After"))
	if w.Code != http.StatusOK && w.Header().Get("Connection") != "close" {
		panic(fmt.Sprintf("a refusal (%d) keeps its connection", w.Code))
	}
	return w.Code, after
}

// Each wrong password makes its address wait twice as long before the next
// is even checked, up to a minute; the right password within the wait is
// refused unchecked too, another address is not held, and a login clears
// the count.
func TestConsoleLogin_WrongPasswordsFromAnAddressWaitLongerEachTime(t *testing.T) {
	b := setupLogins(t)
	const a, other = "198.51.100.7:5000", "203.0.113.9:6000"
	if code, _ := b.login(a, "wrong-password-guess-1"); code != http.StatusUnauthorized {
		t.Fatalf("first wrong password: %d, want 401", code)
	}
	if code, after := b.login(a, testConsolePassword); code != http.StatusTooManyRequests || after < 1 {
		t.Fatalf("the right password right after a wrong one: %d, Retry-After %d; want 429 unchecked", code, after)
	}
	if code, _ := b.login(other, testConsolePassword); code != http.StatusOK {
		t.Fatalf("another address: %d, want 200", code)
	}
	want := loginFirstDelay
	for i := 2; i <= 12; i++ {
		b.wait(want)
		if code, _ := b.login(a, "wrong-password-guess"); code != http.StatusUnauthorized {
			t.Fatalf("wrong password %d after its wait: %d, want 401", i, code)
		}
		want = min(2*want, loginMaxDelay)
		b.wait(want - time.Millisecond)
		if code, _ := b.login(a, testConsolePassword); code != http.StatusTooManyRequests {
			t.Fatalf("after wrong password %d, %v later: %d, want 429 until %v have passed", i, want-time.Millisecond, code, want)
		}
		b.wait(time.Millisecond)
		if i < 12 {
			continue
		}
		if want != loginMaxDelay {
			t.Fatalf("after %d wrong passwords the wait is %v, want the cap %v", i, want, loginMaxDelay)
		}
		if code, _ := b.login(a, testConsolePassword); code != http.StatusOK {
			t.Fatalf("the right password after the wait: %d", code)
		}
	}
	// The login cleared the count: the next wrong one waits the first delay.
	b.login(a, "wrong-again")
	b.wait(loginFirstDelay)
	if code, _ := b.login(a, testConsolePassword); code != http.StatusOK {
		t.Fatalf("a login did not clear the count: %d", code)
	}
}

// A guesser hammering without waiting is refused unchecked, and the log
// gets a line when its count doubles, not one a request.
func TestConsoleLogin_LogsAFewLinesForThousandsOfGuesses(t *testing.T) {
	b := setupLogins(t)
	checked := 0
	for i := range 5000 {
		code, _ := b.login("198.51.100.7:5000", fmt.Sprintf("guess-%d", i))
		if code == http.StatusUnauthorized {
			checked++
		}
		b.wait(10 * time.Millisecond) // 100 guesses a second, 50 s in all
	}
	if checked > 10 {
		t.Errorf("%d of 5000 guesses in 50 s were checked, want at most 10", checked)
	}
	if lines := strings.Count(b.logs.String(), "\n"); lines > 6 {
		t.Errorf("%d log lines for 5000 guesses, want a few:\n%s", lines, b.logs.String())
	}
	if !strings.Contains(b.logs.String(), "refused_unchecked=") {
		t.Errorf("the log does not say how many were refused unchecked:\n%s", b.logs.String())
	}
}

// Wrong passwords from many addresses at once, past the global budget,
// leave only the addresses that logged in before checked, until they slow
// down.
func TestConsoleLogin_ManyAddressesHitTheGlobalLimit(t *testing.T) {
	b := setupLogins(t)
	const operator = "192.0.2.10:4000"
	if code, _ := b.login(operator, testConsolePassword); code != http.StatusOK {
		t.Fatal(code)
	}
	checked := 0
	for i := range 200 {
		if code, _ := b.login(fmt.Sprintf("10.0.%d.%d:1000", i/250, i%250+1), "guess"); code == http.StatusUnauthorized {
			checked++
		}
	}
	if checked > int(loginGlobalBurst) {
		t.Fatalf("%d of 200 guesses from 200 addresses checked at once, want at most %v", checked, loginGlobalBurst)
	}
	if code, _ := b.login("10.9.9.9:1000", testConsolePassword); code != http.StatusTooManyRequests {
		t.Fatalf("a new address under the global limit: %d, want 429", code)
	}
	if code, _ := b.login(operator, testConsolePassword); code != http.StatusOK {
		t.Fatalf("the operator's address under the global limit: %d, want 200", code)
	}
	b.wait(time.Duration(loginGlobalBurst/loginGlobalRate) * time.Second)
	if code, _ := b.login("10.9.9.9:1000", testConsolePassword); code != http.StatusOK {
		t.Fatalf("a new address once the guesses stopped: %d, want 200", code)
	}
	if !strings.Contains(b.logs.String(), "only addresses that logged in before are checked") || !strings.Contains(b.logs.String(), "every address is checked again") {
		t.Errorf("the global limit's start and end are not logged:\n%s", b.logs.String())
	}
}

// IPv6 addresses are counted by their /64: one machine often holds it whole.
func TestLoginAddr_CountsIPv6ByItsSlash64(t *testing.T) {
	for remote, want := range map[string]string{
		"192.0.2.1:80":               "192.0.2.1",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ff::1]:1":     "2001:db8:1:2::/64",
		"not an address":             "not an address",
	} {
		if got := loginAddr(remote); got != want {
			t.Errorf("loginAddr(%q) = %q, want %q", remote, got, want)
		}
	}
}

// A password of white space alone is refused when the console starts,
// whatever its length.
func TestConsoleCredential_RefusesAPasswordOfWhiteSpace(t *testing.T) {
	for _, pass := range []string{strings.Repeat(" ", 16), strings.Repeat(" \t", 12)} {
		_, err := parseCredential("ops:"+pass, "/etc/auth")
		if err == nil || !strings.Contains(err.Error(), "only white space") {
			t.Errorf("password of %d white space characters: %v, want it refused", len(pass), err)
		}
	}
	if _, err := parseCredential("ops:  a password with spaces  ", "/etc/auth"); err != nil {
		t.Errorf("a password with spaces in it: %v", err)
	}
}
