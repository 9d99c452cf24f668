package rocket

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// FuzzParseLevelsSetting feeds --rocketmq-levels values through the parser and the
// limits the RocketMQ adapter builds from them: an accepted list has one
// level per field, and validation answers without panicking, accepts only
// strictly ascending positive levels, and accepts every list the parser did.
func FuzzParseLevelsSetting(f *testing.F) {
	for _, s := range []string{"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h", "1s,5s", "", "-1s 2s", "2s 1s", "1s 1s", "9223372036854775807ns", "1e9h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		levels, err := parseLevelsSetting(s)
		if err != nil {
			return
		}
		if n := len(strings.Fields(strings.ReplaceAll(s, ",", " "))); n != len(levels) {
			t.Fatalf("parseLevelsSetting(%q) = %d levels from %d fields", s, len(levels), n)
		}
		if err := LevelLimits(levels, 0).Validate(); err == nil {
			for i, d := range levels {
				if d <= 0 || (i > 0 && d <= levels[i-1]) {
					t.Fatalf("levels %v validated: level %d is %v", levels, i, d)
				}
			}
		} else {
			t.Fatalf("parseLevelsSetting(%q) accepted %v, which the adapter refuses: %v", s, levels, err)
		}
	})
}

// ParseLevels reads --rocketmq-levels as the broker reads its
// messageDelayLevel, days included, so the list the broker prints can be
// copied into the setting. Commas may separate levels too.
func TestParseLevelsSetting_ReadsTheBrokersList(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	for _, tc := range []struct {
		name, in string
		want     []time.Duration
	}{
		{"broker default", "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
			[]time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 3 * time.Minute, 4 * time.Minute,
				5 * time.Minute, 6 * time.Minute, 7 * time.Minute, 8 * time.Minute, 9 * time.Minute, 10 * time.Minute, 20 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour}},
		{"days", "1s 1m 1h 1d 7d", []time.Duration{time.Second, time.Minute, time.Hour, day, 7 * day}},
		{"commas", "1s,5s, 1d", []time.Duration{time.Second, 5 * time.Second, day}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseLevelsSetting(tc.in)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("parseLevelsSetting(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
			fromBroker, err := ParseLevels(strings.ReplaceAll(tc.in, ",", " "))
			if err != nil || !slices.Equal(got, fromBroker) {
				t.Fatalf("ParseLevels(%q) = %v, %v; the setting reads %v", tc.in, fromBroker, err, got)
			}
		})
	}
}

// A list the broker would not accept is refused with the setting's name:
// a unit it does not know, a level that is not a positive whole number,
// levels out of order, none at all, or a level past the longest duration.
func TestParseLevelsSetting_RefusesWhatTheBrokerWouldNot(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"", " , ", "1x", "500ms", "1m30s", "1.5h", "0s", "-1s 2s", "2s 1s", "1s 1s", "1s 106752d", "1s 213504d"} {
		if got, err := parseLevelsSetting(in); err == nil || !strings.Contains(err.Error(), "--rocketmq-levels") {
			t.Errorf("parseLevelsSetting(%q) = %v, %v; want an error naming --rocketmq-levels", in, got, err)
		}
	}
}
