package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// whenForms is what ParseWhen reads, for its errors.
const whenForms = "want RFC 3339 (2026-12-01T08:00:00Z), +duration from now (+30m) or -duration ago (-5m)"

// ParseWhen reads a due time: an RFC 3339 timestamp (2026-12-01T08:00:00Z),
// a duration from now with a leading plus (+30m, +72h), or a duration ago
// with a leading minus (-5m: due at once). It rejects anything else, signs
// after the first (+-5m, --5m), and durations that overflow.
func ParseWhen(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, errors.New("empty time: " + whenForms)
	}
	if sign := s[0]; sign == '+' || sign == '-' {
		d, err := time.ParseDuration(s[1:])
		if err != nil {
			return time.Time{}, fmt.Errorf("bad duration %q: %w", s, err)
		}
		if d < 0 {
			return time.Time{}, fmt.Errorf("duration %q is negative after its sign: write -5m for 5 minutes ago", s)
		}
		if sign == '-' {
			d = -d
		}
		t := now.Add(d)
		if (sign == '+') == t.Before(now) && d != 0 {
			return time.Time{}, fmt.Errorf("duration %q overflows", s)
		}
		return t, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("bad time %q: %s", s, whenForms)
	}
	return t, nil
}
