package main

import (
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/rocket"
)

// FuzzParseLevels feeds --rocketmq-levels values through the parser and the
// limits the RocketMQ adapter builds from them: an accepted list has one
// level per field, and whatever it holds, validation answers without
// panicking, and accepts only strictly ascending positive levels.
func FuzzParseLevels(f *testing.F) {
	for _, s := range []string{"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h", "1s,5s", "", "-1s 2s", "2s 1s", "1s 1s", "9223372036854775807ns", "1e9h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		levels, err := delaybridge.ParseLevels(s)
		if err != nil {
			return
		}
		if n := len(strings.Fields(strings.ReplaceAll(s, ",", " "))); n != len(levels) {
			t.Fatalf("ParseLevels(%q) = %d levels from %d fields", s, len(levels), n)
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
