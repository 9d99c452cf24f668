package cli

import (
	"strings"
	"testing"
	"time"
)

// -duration is a time that long ago; a sign after the first is refused.
func TestParseWhen_ReadsADurationAgo(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if got, err := ParseWhen(" -5m ", now); err != nil || !got.Equal(now.Add(-5*time.Minute)) {
		t.Errorf("ParseWhen(-5m) = %v, %v; want 5 minutes before now", got, err)
	}
	if got, err := ParseWhen("-0s", now); err != nil || !got.Equal(now) {
		t.Errorf("ParseWhen(-0s) = %v, %v; want now", got, err)
	}
	for in, want := range map[string]string{"--5m": "negative", "-": "bad duration", "-x": "bad duration"} {
		if _, err := ParseWhen(in, now); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseWhen(%q): %v, want %q", in, err, want)
		}
	}
}

func FuzzParseWhenSigns(f *testing.F) {
	for _, s := range []string{"-5m", "+5m", "-9223372036854775807ns", "--1s"} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseWhen(s, now)
		if err == nil && strings.HasPrefix(strings.TrimSpace(s), "-") && got.After(now) {
			t.Fatalf("ParseWhen(%q) = %v, after now", s, got)
		}
	})
}
