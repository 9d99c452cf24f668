package console

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/settings"
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
// secret file is read (settings.ReadSecretFile: one line, size-bounded, contents
// never quoted in errors).
func readCredential(path string) (credential, error) {
	if path == "" {
		return credential{}, errors.New("--auth-file is required: the console needs a user:password credential to check every request against")
	}
	line, err := settings.ReadSecretFile(path)
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
