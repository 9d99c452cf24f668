package console

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

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
