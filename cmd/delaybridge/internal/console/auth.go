package console

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"github.com/delaybridge/delaybridge"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// credential is the one user name and password the console accepts,
// read from --auth-file as "user:password".
type credential struct {
	user     string
	password string
}

// minPassword is the shortest password the console accepts: it
// guards actions on production tasks, and basic auth has no lockout.
const minPassword = 16

// readCredential reads "user:password" from path the way every
// secret file is read (delaybridge.ReadSecretFile: one line, size-bounded, contents
// never quoted in errors).
func readCredential(path string) (credential, error) {
	if path == "" {
		return credential{}, errors.New("--auth-file is required: the console needs a user:password credential to check every request against")
	}
	line, err := delaybridge.ReadSecretFile(path)
	if err != nil {
		return credential{}, fmt.Errorf("--auth-file: %w", err)
	}
	return parseCredential(line, path)
}

func parseCredential(line, path string) (credential, error) {
	user, pass, ok := strings.Cut(line, ":")
	switch {
	case !ok || user == "" || pass == "":
		return credential{}, fmt.Errorf("--auth-file: %s must hold user:password on one line", path)
	case len(pass) < minPassword:
		return credential{}, fmt.Errorf("--auth-file: the password in %s is shorter than %d characters", path, minPassword)
	case strings.TrimSpace(pass) == "":
		return credential{}, fmt.Errorf("--auth-file: the password in %s is only white space: make one with openssl rand -base64 24", path)
	case strings.ContainsFunc(user, func(r rune) bool { return r < 0x21 || r == 0x7f }):
		return credential{}, fmt.Errorf("--auth-file: the user name in %s has spaces or control characters", path)
	}
	return credential{user: user, password: pass}, nil
}

// check reports whether r carries the credential as HTTP basic auth. Both
// parts are compared in constant time, the user name's length included.
func (c credential) check(r *http.Request) bool {
	user, pass, ok := r.BasicAuth()
	if !ok {
		return false
	}
	u := subtle.ConstantTimeCompare(hashOf(user), hashOf(c.user))
	p := subtle.ConstantTimeCompare(hashOf(pass), hashOf(c.password))
	return u&p == 1
}

func hashOf(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// csrf issues and checks the token every form of the console carries. A
// token is "unix-seconds.MAC" where MAC is HMAC-SHA256 under a key made at
// start, over the user and the time: it cannot be forged without the key,
// names who it was issued to, and expires after csrfTTL. A restart makes
// every open form stale, which costs a reload.
type csrf struct {
	key []byte
	now func() time.Time
}

// csrfTTL is how long a form stays good.
const csrfTTL = 12 * time.Hour

// csrfField is the form field that carries the token.
const csrfField = "csrf"

func newCSRF(now func() time.Time) (*csrf, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("console: csrf key: %w", err)
	}
	return &csrf{key: key, now: now}, nil
}

// sealCursor encrypts a search cursor for a "next page" link: a cursor
// carries the last key of its page, and a link holding a task's key would
// leave it in the page, the browser's history and a proxy's access log,
// when the console never shows a key unasked. Sealed with this process's
// key, a link outlives neither a restart nor an alteration.
func (c *csrf) sealCursor(cursor string) string {
	aead := c.cursorAEAD()
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return base64.RawURLEncoding.EncodeToString(aead.Seal(nonce, nonce, []byte(cursor), []byte("delaybridge-console-cursor")))
}

// errStaleCursor answers a page link sealCursor did not make.
var errStaleCursor = errors.New("this page link was made by an earlier run of the console or was altered: start the search again from its first page")

// openCursor returns the cursor sealCursor sealed in s.
func (c *csrf) openCursor(s string) (string, error) {
	aead := c.cursorAEAD()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < aead.NonceSize() {
		return "", errStaleCursor
	}
	plain, err := aead.Open(nil, b[:aead.NonceSize()], b[aead.NonceSize():], []byte("delaybridge-console-cursor"))
	if err != nil {
		return "", errStaleCursor
	}
	return string(plain), nil
}

// cursorAEAD is AES-256-GCM under a key derived from the CSRF key, so the
// two uses never share one.
func (c *csrf) cursorAEAD() cipher.AEAD {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte("delaybridge-console-cursor-key"))
	block, err := aes.NewCipher(m.Sum(nil))
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return aead
}

func (c *csrf) mac(user string, ts int64) string {
	m := hmac.New(sha256.New, c.key)
	fmt.Fprintf(m, "delaybridge-console-csrf\x00%s\x00%d", user, ts)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// token issues a token for user.
func (c *csrf) token(user string) string {
	ts := c.now().Unix()
	return strconv.FormatInt(ts, 10) + "." + c.mac(user, ts)
}

// errCSRF is why an action was refused for its token.
var errCSRF = errors.New("missing, malformed, expired or foreign CSRF token: reload the page and try again")

// check verifies a token issued to user within csrfTTL.
func (c *csrf) check(user, token string) error {
	tsText, mac, ok := strings.Cut(token, ".")
	if !ok {
		return errCSRF
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return errCSRF
	}
	age := c.now().Sub(time.Unix(ts, 0))
	if age < -time.Minute || age > csrfTTL {
		return errCSRF
	}
	if !hmac.Equal([]byte(mac), []byte(c.mac(user, ts))) {
		return errCSRF
	}
	return nil
}

type whoKey struct{}

// who returns the user the request was authenticated as.
func who(r *http.Request) string {
	s, _ := r.Context().Value(whoKey{}).(string)
	return s
}

// maxForm bounds a request body: forms carry a token, a few fields
// and at most a page of task ids.
const maxForm = 64 << 10

// guard wraps the console's handler: security headers on every answer,
// the credential on every request, and on every POST a same-origin check
// (the browser's Sec-Fetch-Site and Origin headers) and the CSRF token.
// Refusals are logged with the remote address.
func (c *console) guard(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	logins := c.logins
	if logins == nil {
		logins = newLoginThrottle(time.Now, c.log)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		if _, _, ok := r.BasicAuth(); !ok {
			// A browser's first request carries no credential: the
			// challenge, not worth a warning each.
			c.log.Debug("console: asked for the credential", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path)
			refuse(w, http.StatusUnauthorized, "401 unauthorized: this console needs its user and password")
			return
		}
		addr := loginAddr(r.RemoteAddr)
		if wait := logins.admit(addr); wait > 0 {
			// Refused unchecked: a guess made now tells nothing.
			secs := int((wait + time.Second - 1) / time.Second)
			h.Set("Retry-After", strconv.Itoa(secs))
			refuse(w, http.StatusTooManyRequests, fmt.Sprintf("429 too many requests: too many wrong passwords; try again in %d s", secs))
			return
		}
		if !c.cred.check(r) {
			logins.failed(addr, r.RemoteAddr)
			refuse(w, http.StatusUnauthorized, "401 unauthorized: wrong user or password")
			return
		}
		logins.succeeded(addr, r.RemoteAddr)
		r = r.WithContext(context.WithValue(r.Context(), whoKey{}, c.cred.user))
		switch r.Method {
		case http.MethodGet, http.MethodHead:
		case http.MethodPost:
			r.Body = http.MaxBytesReader(w, r.Body, maxForm)
			if err := cop.Check(r); err != nil {
				c.log.Warn("console: refused a cross-origin action", "who", who(r), "remote", r.RemoteAddr, "path", r.URL.Path, "err", err)
				http.Error(w, "403 forbidden: cross-origin request", http.StatusForbidden)
				return
			}
			if err := r.ParseForm(); err != nil {
				http.Error(w, "400 bad request: "+err.Error(), http.StatusBadRequest)
				return
			}
			if err := c.csrf.check(who(r), r.PostForm.Get(csrfField)); err != nil {
				c.log.Warn("console: refused an action without a valid CSRF token", "who", who(r), "remote", r.RemoteAddr, "path", r.URL.Path)
				http.Error(w, "403 forbidden: "+err.Error(), http.StatusForbidden)
				return
			}
		default:
			h.Set("Allow", "GET, HEAD, POST")
			http.Error(w, "405 method not allowed", http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refuse answers a request that is not let in. The connection is closed
// after the answer: a guess costs a new connection, and a connection that
// sent a wrong password holds no slot of the cap while it sits idle.
func refuse(w http.ResponseWriter, code int, msg string) {
	h := w.Header()
	if code == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Basic realm="delaybridge console", charset="UTF-8"`)
	}
	h.Set("Connection", "close")
	http.Error(w, msg, code)
}

// The console's answer to wrong passwords. Each wrong one makes its
// address wait before its next is even checked, twice as long as after the
// one before: loginFirstDelay, doubling up to loginMaxDelay. Beyond
// loginGlobalRate wrong passwords a second from all addresses together
// (loginGlobalBurst at once), only addresses that logged in within
// loginKnownFor are checked. A right password from an address clears its
// count.
const (
	loginFirstDelay  = 250 * time.Millisecond
	loginMaxDelay    = time.Minute
	loginForget      = 15 * time.Minute // an address's count is forgotten this long after its last wrong password
	loginGlobalRate  = 2.0
	loginGlobalBurst = 30.0
	loginKnownFor    = 24 * time.Hour
	loginMaxAddrs    = 4096 // addresses remembered; past it an unknown address waits for the global budget
)

// loginThrottle counts wrong passwords by address. Its log lines are few:
// an address's first wrong password, then each time its count doubles, and
// the global limit as it starts and ends, each with what was refused since.
type loginThrottle struct {
	now func() time.Time
	log *slog.Logger

	mu      sync.Mutex
	addrs   map[string]*loginAddrState
	known   map[string]time.Time // addresses that logged in, and when
	tokens  float64              // global budget of wrong passwords
	filled  time.Time            // when tokens was last topped up
	limited bool                 // the global limit is on
	refused int                  // refused unchecked under the global limit
}

type loginAddrState struct {
	failures int
	until    time.Time // no check before then
	last     time.Time // the last wrong password
	refused  int       // refused unchecked since the last log line
}

func newLoginThrottle(now func() time.Time, log *slog.Logger) *loginThrottle {
	return &loginThrottle{now: now, log: log, addrs: map[string]*loginAddrState{}, known: map[string]time.Time{}, tokens: loginGlobalBurst, filled: now()}
}

// loginAddr is the address a login is counted under: the host of
// remote, an IPv6 host by its /64, which one machine often holds whole.
func loginAddr(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return host
}

// loginDelay is how long an address waits after its n-th wrong password
// in a row.
func loginDelay(n int) time.Duration {
	d := loginFirstDelay
	for i := 1; i < n && d < loginMaxDelay; i++ {
		d *= 2
	}
	return min(d, loginMaxDelay)
}

// admit returns how long addr must wait before its credential is checked,
// 0 to check it now. An address with wrong passwords behind it is held for
// its next delay while one check is under way, so guesses sent at once are
// checked one at a time.
func (t *loginThrottle) admit(addr string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.fill(now)
	st := t.addrs[addr]
	if st != nil && now.Before(st.until) {
		st.refused++
		return st.until.Sub(now)
	}
	known := now.Sub(t.known[addr]) < loginKnownFor
	if !known && (t.tokens < 1 || st == nil && len(t.addrs) >= loginMaxAddrs && !t.prune(now)) {
		if !t.limited {
			t.limited = true
			t.log.Warn("console: wrong passwords from many addresses: until they slow down, only addresses that logged in before are checked",
				"limit_per_second", loginGlobalRate)
		}
		t.refused++
		return time.Second
	}
	if st != nil && st.failures > 0 {
		st.until = now.Add(loginDelay(st.failures + 1))
	}
	return 0
}

// fill tops up the global budget, and ends the global limit once it is
// full again.
func (t *loginThrottle) fill(now time.Time) {
	t.tokens = min(loginGlobalBurst, t.tokens+now.Sub(t.filled).Seconds()*loginGlobalRate)
	t.filled = now
	if t.limited && t.tokens >= loginGlobalBurst {
		t.limited = false
		t.log.Warn("console: wrong passwords slowed down: every address is checked again", "refused_unchecked", t.refused)
		t.refused = 0
	}
}

// prune forgets the addresses whose count has lapsed, and reports whether
// there is room for another.
func (t *loginThrottle) prune(now time.Time) bool {
	for a, st := range t.addrs {
		if now.Sub(st.last) > loginForget && !now.Before(st.until) {
			delete(t.addrs, a)
		}
	}
	for a, at := range t.known {
		if now.Sub(at) >= loginKnownFor {
			delete(t.known, a)
		}
	}
	return len(t.addrs) < loginMaxAddrs
}

// failed counts a wrong password from addr (remote is logged).
func (t *loginThrottle) failed(addr, remote string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.fill(now)
	t.tokens = max(0, t.tokens-1)
	st := t.addrs[addr]
	if st == nil || now.Sub(st.last) > loginForget {
		if st == nil && len(t.addrs) >= loginMaxAddrs && !t.prune(now) {
			return // the global budget alone answers it
		}
		st = &loginAddrState{}
		t.addrs[addr] = st
	}
	st.failures++
	st.last = now
	st.until = now.Add(loginDelay(st.failures))
	if st.failures&(st.failures-1) == 0 { // 1, 2, 4, 8, ...
		t.log.Warn("console: refused a wrong user or password", "remote", remote, "wrong_in_a_row", st.failures,
			"next_check_in", loginDelay(st.failures), "refused_unchecked", st.refused)
		st.refused = 0
	}
}

// succeeded clears addr's count and remembers it as an address that logs in.
func (t *loginThrottle) succeeded(addr, remote string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if st := t.addrs[addr]; st != nil {
		if st.failures > 0 {
			t.log.Info("console: logged in after wrong passwords", "remote", remote, "wrong_in_a_row", st.failures)
		}
		delete(t.addrs, addr)
	}
	if _, ok := t.known[addr]; !ok && len(t.known) >= loginMaxAddrs {
		t.prune(now)
		if len(t.known) >= loginMaxAddrs {
			return
		}
	}
	t.known[addr] = now
}
