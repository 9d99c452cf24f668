package redact

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A password is hidden as a whole token, not inside other words: a DSN
// whose password is also the start of its database name shows that name
// intact, while the password itself stays hidden wherever it stands alone.
func TestScrub_HidesAPasswordOnlyAsAWholeToken(t *testing.T) {
	t.Parallel()
	const dsn = "u:x@tcp(127.0.0.1:3306)/x_nope"
	for _, c := range []struct{ in, want string }{
		{"Error 1049 (42000): Unknown database 'x_nope'", "Error 1049 (42000): Unknown database 'x_nope'"},
		{"dial " + dsn + ": refused", "dial (redacted): refused"},
		{"bad DSN u:x@tcp(other)/d", "bad DSN u:(redacted)@tcp(other)/d"},
		{"password x is wrong, xylophone", "password (redacted) is wrong, xylophone"},
		{"x", "(redacted)"},
	} {
		if got := Scrub(errors.New(c.in), dsn).Error(); got != c.want {
			t.Errorf("Scrub(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// A password that is a whole token overlapping a run-on occurrence is still
// found.
func TestReplaceToken_FindsAWholeTokenOverlappingAnother(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ s, tok, want string }{
		{"xa.a.a", "a.a", "xa.R"},
		{"a.a", "a.a", "R"},
		{"(p@ss)", "p@ss", "(R)"},
		{"p@ssword", "p@ss", "p@ssword"},
		{"-!-", "!", "-R-"}, // non-word edges need no boundary
		{"a!b", "!", "aRb"},
		{"über", "ü", "über"},
	} {
		if got := replaceToken(c.s, c.tok, "R"); got != c.want {
			t.Errorf("replaceToken(%q, %q) = %q, want %q", c.s, c.tok, got, c.want)
		}
	}
}

// Longer passwords found in the structure of a DSN that does not parse are
// hidden too.
func TestScrub_HidesTheStructuralPasswordOfABadDSN(t *testing.T) {
	t.Parallel()
	const pw = "S3CRET-pw"
	dsn := "u:" + pw + "@127.0.0.1:3306/db"
	err := Scrub(fmt.Errorf("connecting with %s failed: %s", strings.Replace(dsn, "3306", "1", 1), pw), dsn)
	if strings.Contains(err.Error(), pw) {
		t.Fatalf("the password shows: %v", err)
	}
}
