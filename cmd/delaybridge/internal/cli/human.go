package cli

import (
	"fmt"
	"time"
)

// Ago writes t relative to now for a reader: "58m53s ago", or
// "in 58m53s" for a time still to come.
func Ago(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + HumanDuration(-d)
	}
	return HumanDuration(d) + " ago"
}

// HumanDuration writes d in the two largest units that matter, rounded, a
// second unit of zero left out: 250ms, 42s, 58m53s, 10m, 5h3m, 3d5h, 77
// days (not 1864h8m6.3s).
func HumanDuration(d time.Duration) string {
	if d < 0 {
		return "-" + HumanDuration(-d)
	}
	const day = 24 * time.Hour
	two := func(n int64, big, small string, per int64) string {
		if n%per == 0 {
			return fmt.Sprintf("%d%s", n/per, big)
		}
		return fmt.Sprintf("%d%s%d%s", n/per, big, n%per, small)
	}
	switch {
	case d < time.Second-time.Millisecond/2:
		return d.Round(time.Millisecond).String()
	case d < time.Minute-time.Second/2:
		return fmt.Sprintf("%ds", (d+time.Second/2)/time.Second)
	case d < time.Hour-time.Second/2:
		return two(int64((d+time.Second/2)/time.Second), "m", "s", 60)
	case d < day-time.Minute/2:
		return two(int64((d+time.Minute/2)/time.Minute), "h", "m", 60)
	case d < 10*day-time.Hour/2:
		return two(int64((d+time.Hour/2)/time.Hour), "d", "h", 24)
	}
	return fmt.Sprintf("%d days", (d+day/2)/day)
}
