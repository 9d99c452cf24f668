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
	for _, s := range secretParts(secrets) {
		msg = strings.ReplaceAll(msg, s, "(redacted)")
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
// so a DSN or URL that does not parse still has its password found.
func secretParts(secrets []string) []string {
	var out []string
	add := func(s string) {
		q := strconv.Quote(s)
		for _, v := range []string{s, q[1 : len(q)-1]} {
			if v != "" && !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	for _, s := range secrets {
		add(s)
		add(structuralPassword(s))
		if cfg, err := mysql.ParseDSN(s); err == nil {
			add(cfg.Passwd)
		}
		if u, err := url.Parse(s); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok {
				add(p)
				add(url.QueryEscape(p))
				add(url.PathEscape(p))
			}
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

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
