package cli

import (
	"strings"
	"testing"
	"time"
)

func TestParseWhen(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
		err  string
	}{
		{in: "+30m", want: now.Add(30 * time.Minute)},
		{in: " +72h ", want: now.Add(72 * time.Hour)},
		{in: "2026-12-01T08:00:00Z", want: time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)},
		{in: "2026-12-01T08:00:00.250+08:00", want: time.Date(2026, 12, 1, 0, 0, 0, 250e6, time.UTC)},
		{in: "", err: "empty"},
		{in: "+", err: "bad duration"},
		{in: "+-5m", err: "negative"},
		{in: "+9999999999h", err: "bad duration"},
		{in: "tomorrow", err: "RFC 3339"},
		{in: "2026-13-01T00:00:00Z", err: "RFC 3339"},
	} {
		got, err := ParseWhen(tc.in, now)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseWhen(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("ParseWhen(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseWhen(f *testing.F) {
	for _, s := range []string{"+30m", "2026-12-01T08:00:00Z", "+-1ns", "+9223372036854775807ns", "x"} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseWhen(s, now)
		if err == nil && strings.HasPrefix(strings.TrimSpace(s), "+") && got.Before(now) {
			t.Fatalf("ParseWhen(%q) = %v, before now", s, got)
		}
	})
}
