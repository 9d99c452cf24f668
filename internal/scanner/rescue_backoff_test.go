package scanner_test

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
)

// nextAttempt reads what MarkRescued left on the task: when its next
// rescue may come (before Grace is added back) and how often it was
// rescued.
func (b *bundle) nextAttempt(t *testing.T, key string) (nextMs int64, rescues int) {
	t.Helper()
	if err := b.db.QueryRow("SELECT next_attempt_ms, rescues FROM delay_task WHERE task_key = ?", key).Scan(&nextMs, &rescues); err != nil {
		t.Fatal(err)
	}
	return nextMs, rescues
}

// A task whose consumer never finishes it (its handler always fails, or
// nothing subscribes to its topic) must not be re-published every Grace
// for ever: each rescue waits Grace, then twice as long, then four times
// ... past the last one. The fake clock steps just past each boundary, so
// the test is exact and takes no wall time.
func TestScanner_EachRescueOfATaskWaitsLongerThanTheLast(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const grace = 10 * time.Second
	b.task(t, "lost", outbox.StatePublished, time.Now().Add(-time.Hour))
	now := time.UnixMilli(time.Now().UnixMilli())
	// No hold: this test is about the per-row wait alone, and nothing
	// handles the rescued messages.
	s := b.scanner(t, b.mem, scanner.Config{Grace: grace, HoldWhileBehind: -1, Now: func() time.Time { return now }})
	rescue := func(at time.Time, want int, why string) {
		t.Helper()
		now = at
		if n, err := s.Rescue(b.ctx); err != nil || n != want {
			t.Fatalf("%s: Rescue = %d, %v; want %d", why, n, err, want)
		}
	}
	// next_attempt_ms is compared with now − Grace, so the wait past
	// Grace after rescue number r is Grace × (2^r − 1).
	wantNext := func(stamp time.Time, wait time.Duration, rescues int) {
		t.Helper()
		next, n := b.nextAttempt(t, "lost")
		if want := stamp.Add(wait).UnixMilli(); next != want || n != rescues {
			t.Errorf("after rescue %d: next_attempt_ms %d (stamp %+dms), rescues %d; want stamp %+dms, rescues %d",
				rescues, next, next-stamp.UnixMilli(), n, wait.Milliseconds(), rescues)
		}
	}
	t0 := now
	rescue(t0, 1, "an hour overdue")
	wantNext(t0, 0, 1)
	t1 := t0.Add(grace + time.Millisecond)
	rescue(t1, 1, "Grace past the first rescue")
	wantNext(t1, grace, 2)
	rescue(t1.Add(grace+time.Millisecond), 0, "Grace past the second rescue, which waits twice Grace")
	t2 := t1.Add(2*grace + time.Millisecond)
	rescue(t2, 1, "twice Grace past the second rescue")
	wantNext(t2, 3*grace, 3)
}

// A task rescued many times waits Grace × 255 past Grace between rescues,
// at most the hour the scanner allows. The doubling stops after eight
// rescues: shifted by the raw count, 1 << 70 is 0 in MariaDB and 0 − 1
// is out of range, so the rescue would be published but never recorded,
// and the task re-published on every pass.
func TestScanner_ATaskRescuedManyTimesWaitsAtMostGraceTimes255OrAnHour(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		grace time.Duration
		wait  time.Duration
	}{
		{"grace times 255", 10 * time.Second, 255 * 10 * time.Second},
		{"capped at an hour", time.Minute, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.task(t, "lost", outbox.StatePublished, time.Now().Add(-24*time.Hour))
			if _, err := b.db.Exec("UPDATE delay_task SET rescues = 70 WHERE task_key = 'lost'"); err != nil {
				t.Fatal(err)
			}
			now := time.UnixMilli(time.Now().UnixMilli())
			s := b.scanner(t, b.mem, scanner.Config{Grace: tc.grace, HoldWhileBehind: -1, Now: func() time.Time { return now }})
			if n, err := s.Rescue(b.ctx); err != nil || n != 1 {
				t.Fatalf("Rescue = %d, %v; want the task rescued", n, err)
			}
			next, rescues := b.nextAttempt(t, "lost")
			if want := now.Add(tc.wait).UnixMilli(); next != want || rescues != 71 {
				t.Fatalf("next_attempt_ms %d (stamp %+dms), rescues %d; want stamp %+dms, rescues 71",
					next, next-now.UnixMilli(), rescues, tc.wait.Milliseconds())
			}
		})
	}
}
