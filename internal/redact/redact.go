// Package redact keeps passwords out of logs and errors: it hides the
// password of a MySQL DSN or a URL and scrubs secrets from error messages.
package redact

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/redacturl"
)

// DSN hides the password of a MySQL DSN for logs and errors.
func DSN(dsn string) string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "(unparseable DSN)"
	}
	if cfg.Passwd != "" {
		cfg.Passwd = "xxxxx"
	}
	return cfg.FormatDSN()
}

// Scrub removes from err's message every secret, and the password inside
// each secret that is a DSN or a URL, in case a driver echoes one. A
// *url.Error is rewritten first: net/url quotes the whole URL with %q, so a
// tab, a quote or a backslash anywhere in it escapes the text replacement,
// and it may quote a piece of a password as a port.
func Scrub(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		msg = strings.ReplaceAll(msg, ue.Error(), fmt.Sprintf("%s %q: malformed URL", ue.Op, redacturl.Hide(ue.URL)))
	}
	wholes, passwords := secretParts(secrets)
	for _, s := range wholes {
		msg = strings.ReplaceAll(msg, s, "(redacted)")
	}
	for _, p := range passwords {
		msg = replaceToken(msg, p, "(redacted)")
	}
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}

// secretParts returns secrets and the passwords inside them, each also as
// %q would print it, longest first so a whole DSN is replaced before its
// password. A password is taken both from a successful parse and from the
// text's structure (between "://" and the last '@', after the first ':'),
// so a DSN or URL that does not parse still has its password found. The
// passwords come apart from the secrets: a secret is hidden wherever it
// stands, a password only as a whole token (replaceToken), so a short
// password does not eat the database name it is part of.
func secretParts(secrets []string) (wholes, passwords []string) {
	add := func(out *[]string, s string) {
		q := strconv.Quote(s)
		for _, v := range []string{s, q[1 : len(q)-1]} {
			if v != "" && !slices.Contains(*out, v) {
				*out = append(*out, v)
			}
		}
	}
	for _, s := range secrets {
		add(&wholes, s)
		add(&passwords, structuralPassword(s))
		if cfg, err := mysql.ParseDSN(s); err == nil {
			add(&passwords, cfg.Passwd)
		}
		if u, err := url.Parse(s); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok {
				add(&passwords, p)
				add(&passwords, url.QueryEscape(p))
				add(&passwords, url.PathEscape(p))
			}
		}
	}
	longestFirst := func(a, b string) int { return len(b) - len(a) }
	slices.SortFunc(wholes, longestFirst)
	slices.SortFunc(passwords, longestFirst)
	return wholes, passwords
}

// replaceToken replaces every occurrence of tok in s that stands as a
// whole token: one that does not run on into a letter, a digit or '_'
// where tok's own edge is one. So password "x" is hidden in "u:x@tcp" and
// "password x", and left alone in "'x_nope'" or "xylophone".
func replaceToken(s, tok, with string) string {
	first, _ := utf8.DecodeRuneInString(tok)
	last, _ := utf8.DecodeLastRuneInString(tok)
	var b strings.Builder
	for {
		i := strings.Index(s, tok)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		before, _ := utf8.DecodeLastRuneInString(s[:i])
		after, _ := utf8.DecodeRuneInString(s[i+len(tok):])
		whole := !(i > 0 && isWord(first) && isWord(before)) && !(i+len(tok) < len(s) && isWord(last) && isWord(after))
		if !whole {
			// On by one rune only: a whole occurrence may overlap this one.
			_, n := utf8.DecodeRuneInString(s[i:])
			b.WriteString(s[:i+n])
			s = s[i+n:]
			continue
		}
		b.WriteString(s[:i])
		b.WriteString(with)
		s = s[i+len(tok):]
	}
}

func isWord(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

// structuralPassword returns what stands where a DSN's or a URL's password
// would, without parsing: after the first ':' of the text before the last
// '@' (and after "://", if any).
func structuralPassword(s string) string {
	if _, rest, ok := strings.Cut(s, "://"); ok {
		s = rest
	}
	at := strings.LastIndex(s, "@")
	if at < 0 {
		return ""
	}
	_, p, _ := strings.Cut(s[:at], ":")
	return p
}
