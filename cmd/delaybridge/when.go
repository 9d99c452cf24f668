package main

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// parseWhen reads a due time: an RFC 3339 timestamp (2026-12-01T08:00:00Z)
// or a duration from now with a leading plus (+30m, +72h). It rejects
// anything else, and durations that are negative or overflow.
func parseWhen(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, errors.New("empty time: want RFC 3339 (2026-12-01T08:00:00Z) or +duration (+30m)")
	}
	if rest, ok := strings.CutPrefix(s, "+"); ok {
		d, err := time.ParseDuration(rest)
		if err != nil {
			return time.Time{}, fmt.Errorf("bad duration %q: %w", s, err)
		}
		if d < 0 {
			return time.Time{}, fmt.Errorf("duration %q is negative", s)
		}
		t := now.Add(d)
		if t.Before(now) {
			return time.Time{}, fmt.Errorf("duration %q overflows", s)
		}
		return t, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("bad time %q: want RFC 3339 (2026-12-01T08:00:00Z) or +duration (+30m)", s)
	}
	return t, nil
}
