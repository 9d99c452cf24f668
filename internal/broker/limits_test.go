package broker_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
)

var rocketLevels = []time.Duration{
	time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 3 * time.Minute, 4 * time.Minute, 5 * time.Minute,
	6 * time.Minute, 7 * time.Minute, 8 * time.Minute, 9 * time.Minute, 10 * time.Minute,
	20 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour,
}

func TestLimitsPlan(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	timer := broker.Limits{MaxHop: 3 * time.Hour, Precision: time.Second}
	levels := broker.Limits{Levels: rocketLevels, Precision: time.Second}
	for _, tc := range []struct {
		name   string
		limits broker.Limits
		in     time.Duration
		want   broker.HopPlan
	}{
		{"past due delivers now", timer, -time.Minute, broker.HopPlan{Last: true}},
		{"due now delivers now", timer, 0, broker.HopPlan{Last: true}},
		{"within the hop limit is one last hop", timer, 90 * time.Minute, broker.HopPlan{Delay: 90 * time.Minute, Last: true}},
		{"exactly the hop limit is one last hop", timer, 3 * time.Hour, broker.HopPlan{Delay: 3 * time.Hour, Last: true}},
		{"beyond the hop limit hops at the limit", timer, 7 * time.Hour, broker.HopPlan{Delay: 3 * time.Hour}},
		{"no limit is always one hop", broker.Limits{}, 9000 * time.Hour, broker.HopPlan{Delay: 9000 * time.Hour, Last: true}},
		{"level rounds down", levels, 7 * time.Minute, broker.HopPlan{Delay: 7 * time.Minute, Level: 11, Last: true}},
		{"level rounds down and leaves a remainder to hop", levels, 15 * time.Minute, broker.HopPlan{Delay: 10 * time.Minute, Level: 14}},
		{"remainder under the smallest level is last", levels, 5*time.Second + 900*time.Millisecond, broker.HopPlan{Delay: 5 * time.Second, Level: 2, Last: true}},
		{"under the smallest level delivers now", levels, 999 * time.Millisecond, broker.HopPlan{Last: true}},
		{"past the last level takes the last level", levels, 30 * time.Hour, broker.HopPlan{Delay: 2 * time.Hour, Level: 18}},
		{"MaxHop caps the levels", broker.Limits{Levels: rocketLevels, MaxHop: 45 * time.Minute}, 3 * time.Hour, broker.HopPlan{Delay: 30 * time.Minute, Level: 16}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.limits.Plan(now, now.Add(tc.in)); got != tc.want {
				t.Fatalf("Plan(%v) = %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

func TestLimitsValidate_RejectsUnusableLimits(t *testing.T) {
	t.Parallel()
	for name, l := range map[string]broker.Limits{
		"negative max hop":        {MaxHop: -1},
		"negative precision":      {Precision: -1},
		"negative relay workers":  {RelayWorkers: -1},
		"zero level":              {Levels: []time.Duration{0, time.Second}},
		"descending levels":       {Levels: []time.Duration{2 * time.Second, time.Second}},
		"duplicate levels":        {Levels: []time.Duration{time.Second, time.Second}},
		"smallest level over max": {Levels: []time.Duration{time.Minute}, MaxHop: time.Second},
	} {
		if err := l.Validate(); err == nil {
			t.Errorf("%s: Validate() = nil, want an error", name)
		}
	}
	if err := (broker.Limits{Levels: rocketLevels, MaxHop: time.Hour}).Validate(); err != nil {
		t.Errorf("RocketMQ default levels: %v", err)
	}
}

// chain walks Plan the way a message travels: publish, wait the hop's delay,
// plan again, until the planner says the hop was the last.
func chain(l broker.Limits, now, due time.Time) (hops []broker.HopPlan, arrive time.Time) {
	for {
		h := l.Plan(now, due)
		hops = append(hops, h)
		now = now.Add(h.Delay)
		if h.Last || len(hops) > 1_000_000 {
			return hops, now
		}
	}
}

// checkChain asserts every planner invariant for one due time.
func checkChain(t *testing.T, l broker.Limits, remaining time.Duration) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	due := now.Add(remaining)
	hops, arrive := chain(l, now, due)
	if remaining <= 0 {
		if len(hops) != 1 || hops[0] != (broker.HopPlan{Last: true}) {
			t.Fatalf("limits %+v, due %v ago: hops %v, want one immediate last hop", l, -remaining, hops)
		}
		return
	}
	if arrive.After(due) {
		t.Fatalf("limits %+v, remaining %v: hops %v end at %v, past due by %v", l, remaining, hops, arrive, arrive.Sub(due))
	}
	if bound := l.MaxHops(remaining); len(hops) > bound {
		t.Fatalf("limits %+v, remaining %v: %d hops, more than MaxHops %d", l, remaining, len(hops), bound)
	}
	gap := due.Sub(arrive)
	for _, h := range hops {
		if h.Delay < 0 || (l.MaxHop > 0 && h.Delay > l.MaxHop) {
			t.Fatalf("limits %+v, remaining %v: hop %v outside [0, MaxHop]", l, remaining, h.Delay)
		}
		if len(l.Levels) > 0 && h.Delay != 0 {
			if i := slices.Index(l.Levels, h.Delay); i < 0 || i+1 != h.Level {
				t.Fatalf("limits %+v: hop %v level %d is not one of the levels", l, h.Delay, h.Level)
			}
		}
	}
	// What is left after the last hop is what the consumer waits out: it is
	// zero without levels, and below the smallest level with them.
	if len(l.Levels) == 0 && remaining > 0 && gap != 0 {
		t.Fatalf("limits %+v, remaining %v: chain ends %v early", l, remaining, gap)
	}
	if len(l.Levels) > 0 && gap >= l.Levels[0] {
		t.Fatalf("limits %+v, remaining %v: chain ends %v early, at least a whole level", l, remaining, gap)
	}
}

func TestLimitsPlan_ChainsKeepInvariants(t *testing.T) {
	t.Parallel()
	for _, l := range []broker.Limits{
		{MaxHop: 3 * 24 * time.Hour},
		{MaxHop: time.Second},
		{Levels: rocketLevels},
		{Levels: rocketLevels, MaxHop: 40 * time.Minute},
		{Levels: []time.Duration{time.Second, 7 * time.Second}},
	} {
		for _, r := range []time.Duration{0, time.Millisecond, 999 * time.Millisecond, time.Second, 59 * time.Minute, 7*24*time.Hour + 1234*time.Millisecond} {
			checkChain(t, l, r)
		}
	}
}

func FuzzLimitsPlan(f *testing.F) {
	f.Add(int64(3*time.Hour), int64(0), int64(10*time.Hour))
	f.Add(int64(0), int64(1), int64(17*time.Minute+3*time.Second))
	f.Add(int64(40*time.Minute), int64(1), int64(5*time.Hour))
	f.Add(int64(time.Second), int64(0), int64(-time.Minute))
	f.Fuzz(func(t *testing.T, maxHop, useLevels, remaining int64) {
		l := broker.Limits{MaxHop: time.Duration(maxHop)}
		if useLevels%2 == 1 {
			l.Levels = rocketLevels
		}
		// Keep the chain short enough to walk: at least a millisecond per
		// hop and at most 10 years.
		if l.MaxHop != 0 && l.MaxHop < time.Millisecond {
			l.MaxHop = time.Millisecond
		}
		r := time.Duration(remaining) % (10 * 365 * 24 * time.Hour)
		if l.MaxHop > 0 && len(l.Levels) == 0 && r/l.MaxHop > 100_000 {
			l.MaxHop = r / 100_000
		}
		if l.Validate() != nil {
			return
		}
		checkChain(t, l, r)
	})
}

func ExampleLimits_Plan() {
	// RocketMQ 5 timer messages with a 3-day broker limit; a task due in 7 days.
	l := broker.Limits{MaxHop: 72 * time.Hour, Precision: time.Second}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	due := now.Add(7 * 24 * time.Hour)
	for {
		h := l.Plan(now, due)
		fmt.Printf("hop %v last=%v\n", h.Delay, h.Last)
		now = now.Add(h.Delay)
		if h.Last {
			break
		}
	}
	// Output:
	// hop 72h0m0s last=false
	// hop 72h0m0s last=false
	// hop 24h0m0s last=true
}
