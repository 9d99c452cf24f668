// Package redacturl hides the password of a URL for logs and errors. It
// imports nothing of delaybridge, so both the RabbitMQ adapter (whose
// RedactURL it is) and the error scrubbing of internal/redact use it
// without one depending on the other.
package redacturl

import "strings"

// Hide returns raw with the password in its user information replaced by
// "xxxxx". It works on the text's structure, not on a successful parse, so
// a URL that does not parse (a stray tab, a reserved character left
// unencoded in the password) is redacted too: everything between "://" and
// the last '@' counts as user information, and only the part before its
// first ':' is kept. A '@' in the path makes it hide more than the user
// information, never less. Text without "://" but with a '@' has no
// structure to trust and is hidden entirely.
func Hide(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	at := strings.LastIndex(rest, "@")
	switch {
	case !ok && strings.Contains(raw, "@"):
		return "(unparseable URL)"
	case !ok || at < 0:
		return raw
	}
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		return raw
	}
	return scheme + "://" + user + ":xxxxx@" + rest[at+1:]
}
