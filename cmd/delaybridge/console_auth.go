package main

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
	"net/http"
	"strconv"
	"strings"
	"time"
)

// consoleCredential is the one user name and password the console accepts,
// read from --auth-file as "user:password".
type consoleCredential struct {
	user     string
	password string
}

// minConsolePassword is the shortest password the console accepts: it
// guards actions on production tasks, and basic auth has no lockout.
const minConsolePassword = 16

// readConsoleCredential reads "user:password" from path the way every
// secret file is read (readSecretFile: one line, size-bounded, contents
// never quoted in errors).
func readConsoleCredential(path string) (consoleCredential, error) {
	if path == "" {
		return consoleCredential{}, errors.New("--auth-file is required: the console needs a user:password credential to check every request against")
	}
	line, err := readSecretFile(path)
	if err != nil {
		return consoleCredential{}, fmt.Errorf("--auth-file: %w", err)
	}
	return parseConsoleCredential(line, path)
}

func parseConsoleCredential(line, path string) (consoleCredential, error) {
	user, pass, ok := strings.Cut(line, ":")
	switch {
	case !ok || user == "" || pass == "":
		return consoleCredential{}, fmt.Errorf("--auth-file: %s must hold user:password on one line", path)
	case len(pass) < minConsolePassword:
		return consoleCredential{}, fmt.Errorf("--auth-file: the password in %s is shorter than %d characters", path, minConsolePassword)
	case strings.ContainsFunc(user, func(r rune) bool { return r < 0x21 || r == 0x7f }):
		return consoleCredential{}, fmt.Errorf("--auth-file: the user name in %s has spaces or control characters", path)
	}
	return consoleCredential{user: user, password: pass}, nil
}

// check reports whether r carries the credential as HTTP basic auth. Both
// parts are compared in constant time, the user name's length included.
func (c consoleCredential) check(r *http.Request) bool {
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

// consoleMaxForm bounds a request body: forms carry a token, a few fields
// and at most a page of task ids.
const consoleMaxForm = 64 << 10

// guard wraps the console's handler: security headers on every answer,
// the credential on every request, and on every POST a same-origin check
// (the browser's Sec-Fetch-Site and Origin headers) and the CSRF token.
// Refusals are logged with the remote address.
func (c *console) guard(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		if !c.cred.check(r) {
			c.log.Warn("console: refused a request without the credential", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path)
			h.Set("WWW-Authenticate", `Basic realm="delaybridge console", charset="UTF-8"`)
			// A guess costs a new connection, and a connection that sent
			// a wrong password holds no slot while it sits idle.
			h.Set("Connection", "close")
			http.Error(w, "401 unauthorized: this console needs its user and password", http.StatusUnauthorized)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), whoKey{}, c.cred.user))
		switch r.Method {
		case http.MethodGet, http.MethodHead:
		case http.MethodPost:
			r.Body = http.MaxBytesReader(w, r.Body, consoleMaxForm)
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
