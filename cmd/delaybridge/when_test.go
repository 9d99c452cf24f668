package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/rocket"
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
		got, err := parseWhen(tc.in, now)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseWhen(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("parseWhen(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseWhen(f *testing.F) {
	for _, s := range []string{"+30m", "2026-12-01T08:00:00Z", "+-1ns", "+9223372036854775807ns", "x"} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseWhen(s, now)
		if err == nil && strings.HasPrefix(strings.TrimSpace(s), "+") && got.Before(now) {
			t.Fatalf("parseWhen(%q) = %v, before now", s, got)
		}
	})
}

func TestParseConfigFile_RejectsBadLines(t *testing.T) {
	good, err := parseConfigFile(strings.NewReader("# c\n\nmysql-dsn = \"a=b\"\nlog-level=warn\n"))
	if err != nil || good["mysql-dsn"] != "a=b" || good["log-level"] != "warn" {
		t.Fatalf("parse = %v, %v", good, err)
	}
	for _, bad := range []string{"no equals sign", "= value", "a b = c", "x = 1\nx = 2"} {
		if _, err := parseConfigFile(strings.NewReader(bad)); err == nil {
			t.Errorf("parseConfigFile(%q) accepted", bad)
		}
	}
}

func FuzzParseConfigFile(f *testing.F) {
	f.Add("mysql-dsn = x\n# c\nlog-level = \"debug\"\n")
	f.Add("a=\"\nb")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseConfigFile(strings.NewReader(s))
		if err != nil {
			return
		}
		for k := range m {
			if !regexp.MustCompile(`^[a-z][a-z0-9_-]*$`).MatchString(k) {
				t.Fatalf("accepted bad name %q", k)
			}
		}
	})
}

// FuzzParseLevels feeds --rocketmq-levels values through the parser and the
// limits the RocketMQ adapter builds from them: an accepted list has one
// level per field, and whatever it holds, validation answers without
// panicking, and accepts only strictly ascending positive levels.
func FuzzParseLevels(f *testing.F) {
	for _, s := range []string{"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h", "1s,5s", "", "-1s 2s", "2s 1s", "1s 1s", "9223372036854775807ns", "1e9h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		levels, err := parseLevels(s)
		if err != nil {
			return
		}
		if n := len(strings.Fields(strings.ReplaceAll(s, ",", " "))); n != len(levels) {
			t.Fatalf("parseLevels(%q) = %d levels from %d fields", s, len(levels), n)
		}
		if err := rocket.LevelLimits(levels, 0).Validate(); err == nil {
			for i, d := range levels {
				if d <= 0 || (i > 0 && d <= levels[i-1]) {
					t.Fatalf("levels %v validated: level %d is %v", levels, i, d)
				}
			}
		}
	})
}
