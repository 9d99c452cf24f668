package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
	"github.com/delaybridge/delaybridge/outbox"
)

// counts is the part of Stats the summary holds.
type counts struct {
	Backlog               map[outbox.State]map[string]int
	Done, Cancelled, Dead int
	Overdue               int
}

func countsOf(st *outbox.Stats) counts {
	return counts{Backlog: st.Backlog, Done: st.Done, Cancelled: st.Cancelled, Dead: st.Dead, Overdue: st.Overdue}
}

// traffic drives tasks through every state the way the system does: the
// relay publishes, Handle finishes, Cancel cancels; a rejected publish and
// a lost one are set directly.
func traffic(t *testing.T, b *bundle) {
	t.Helper()
	var orders []*broker.Message
	for i := range 6 {
		orders = append(orders, b.order(t, fmt.Sprintf("o%d", i), time.Now().Add(-time.Minute)))
	}
	for i := range 4 {
		b.schedule(t, outbox.Task{Topic: "mail", Key: fmt.Sprintf("m%d", i), DueAt: time.Now().Add(time.Hour)})
	}
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	n, err := newRelay(t, b, mem, outbox.RelayConfig{}).Once(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 10 {
		t.Fatalf("relayed: got %v, want %v", n, 10)
	}
	for _, m := range orders[:3] {
		o, err := outbox.Handle(b.ctx, b.db, m, cancelOrder(m.Key))
		if err != nil {
			t.Fatal(err)
		}
		if o != outbox.Handled {
			t.Fatalf("got %v, want %v", o, outbox.Handled)
		}
	}
	if err := outbox.Cancel(b.ctx, b.db, "mail", "m0"); err != nil {
		t.Fatal(err)
	}
	b.schedule(t, outbox.Task{Topic: "mail", Key: "m4", DueAt: time.Now().Add(time.Hour)})
	for _, q := range []string{
		"UPDATE delay_task SET state = 'dead' WHERE task_key = 'o3'",
		"UPDATE delay_task SET published_ms = published_ms - 3600000, next_attempt_ms = 0 WHERE task_key = 'o4'",
		// o4 and o5, published and not done a minute past due, are both
		// overdue however recently each was published.
	} {
		_, err := b.db.ExecContext(b.ctx, q)
		if err != nil {
			t.Fatalf("%v: %v", q, err)
		}
	}
}

func TestRefreshStats_SummaryEqualsALiveCountAfterTraffic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	traffic(t, b)
	const grace = 30 * time.Second

	if err := outbox.RefreshStats(b.ctx, b.db, grace); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	summary, err := outbox.ReadStats(b.ctx, b.db, now, grace, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	live, err := outbox.CountStats(b.ctx, b.db, now, grace, time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	want := counts{
		Backlog: map[outbox.State]map[string]int{
			outbox.StatePending:   {"mail": 1},
			outbox.StatePublished: {"order-cancel": 2, "mail": 3},
			outbox.StateDead:      {"order-cancel": 1},
		},
		Done: 3, Cancelled: 1, Dead: 1, Overdue: 2,
	}
	if got := countsOf(live); !reflect.DeepEqual(got, want) {
		t.Fatalf("live count: got %v, want %v", got, want)
	}
	if got := countsOf(summary); !reflect.DeepEqual(got, want) {
		t.Fatalf("summary: got %v, want %v", got, want)
	}
	if summary.Live {
		t.Fatal("the summary says it is a live count")
	}
	if !live.Live {
		t.Fatal("the live count says it is a summary")
	}
	if got, want := summary.OldestPendingDue, live.OldestPendingDue; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got, want := summary.Lateness, live.Lateness; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := summary.Lateness.Count; got != 3 {
		t.Fatalf("got %v, want %v", got, 3)
	}
}

// The summary is what the last refresh counted, not what is there now, and
// says how old it is.
func TestReadStats_StaleSummaryReportsItsAge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, outbox.Task{Topic: "t", Key: "before", DueAt: time.Now().Add(time.Hour)})
	if err := outbox.RefreshStats(b.ctx, b.db, time.Second); err != nil {
		t.Fatal(err)
	}
	_, err := b.db.ExecContext(b.ctx, "UPDATE delay_task_stats_run SET computed_ms = computed_ms - 3600000")
	if err != nil {
		t.Fatal(err)
	}
	b.schedule(t, outbox.Task{Topic: "t", Key: "after", DueAt: time.Now().Add(time.Hour)})

	st, err := outbox.ReadStats(b.ctx, b.db, time.Now(), time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Backlog[outbox.StatePending]["t"]; got != 1 {
		t.Fatalf("the summary counts what the refresh saw: got %v, want %v", got, 1)
	}
	if st.CountsAge < time.Hour || st.CountsAge >= time.Hour+time.Minute {
		t.Fatalf("CountsAge %v, want an hour and less than a minute", st.CountsAge)
	}
	if d := time.Since(st.CountsAt) - time.Hour; d < -time.Minute || d > time.Minute {
		t.Fatalf("CountsAt %v, want within a minute of an hour ago", st.CountsAt)
	}
}

// Before any refresh ReadStats has no counts to give, and says so with a
// zero CountsAt rather than zeros that read as an empty outbox.
func TestReadStats_WithoutSummaryHasNoCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	b.schedule(t, outbox.Task{Topic: "t", Key: "k", DueAt: due})
	st, err := outbox.ReadStats(b.ctx, b.db, time.Now(), time.Second, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !st.CountsAt.IsZero() {
		t.Fatalf("CountsAt %v, want zero: no refresh ran", st.CountsAt)
	}
	if len(st.Backlog) != 0 {
		t.Fatalf("Backlog %v, want none", st.Backlog)
	}
	if !st.OldestPendingDue.Equal(due) {
		t.Fatalf("live figures are still read: %v", st.OldestPendingDue)
	}
}

// lockName is the lock StatsRefresher documents: delaybridge_stats_ and
// the MD5 of the database name.
func lockName(t *testing.T, db *sql.DB) string {
	t.Helper()
	var name string
	if err := db.QueryRow("SELECT CONCAT('delaybridge_stats_', MD5(DATABASE()))").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestStatsRefresher_SkipsWhileAnotherHoldsTheLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder, err := b.db.Conn(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	var got int
	if err := holder.QueryRowContext(b.ctx, "SELECT GET_LOCK(?, 0)", lockName(t, b.db)).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != 1 {
		t.Fatalf("got %v, want %v", got, 1)
	}

	r := outbox.NewStatsRefresher(b.db, outbox.StatsRefresherConfig{Logger: quiet()})
	ran, err := r.Once(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ran {
		t.Fatalf("refreshed while another process held the lock")
	}
	if n := b.countRows(t, "delay_task_stats_run"); n != 0 {
		t.Fatalf("%d rows in delay_task_stats_run, want 0", n)
	}

	_, err = holder.ExecContext(b.ctx, "SELECT RELEASE_LOCK(?)", lockName(t, b.db))
	if err != nil {
		t.Fatal(err)
	}
	ran, err = r.Once(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Fatalf("did not refresh once the lock was free")
	}
	if got := b.countRows(t, "delay_task_stats_run"); got != 1 {
		t.Fatalf("got %v, want %v", got, 1)
	}
}

// Two daemons' refreshers, started together and again and again, count
// once per interval between them.
func TestStatsRefresher_TwoRefreshersCountOncePerInterval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Time passes by moving the last count back: the refreshers go by the
	// database's clock, which wrote it.
	age := func(d time.Duration) {
		t.Helper()
		if _, err := b.db.ExecContext(b.ctx, "UPDATE delay_task_stats_run SET computed_ms = computed_ms - ?", d.Milliseconds()); err != nil {
			t.Fatal(err)
		}
	}
	cfg := outbox.StatsRefresherConfig{Interval: time.Minute, Logger: quiet()}
	refreshers := []*outbox.StatsRefresher{outbox.NewStatsRefresher(b.db, cfg), outbox.NewStatsRefresher(b.db, cfg)}
	round := func() int {
		var wg sync.WaitGroup
		ran := make([]bool, len(refreshers))
		for i, r := range refreshers {
			wg.Go(func() {
				var err error
				ran[i], err = r.Once(b.ctx)
				if err != nil {
					t.Error(err) // Fatal must not run outside the test's goroutine
				}
			})
		}
		wg.Wait()
		n := 0
		for _, r := range ran {
			if r {
				n++
			}
		}
		return n
	}
	if got := round(); got != 1 {
		t.Fatalf("first round: got %v, want %v", got, 1)
	}
	if got := round(); got != 0 {
		t.Fatalf("a round within the interval: got %v, want %v", got, 0)
	}
	age(2 * time.Minute)
	if got := round(); got != 1 {
		t.Fatalf("a round after the interval: got %v, want %v", got, 1)
	}

	// A count that took long spaces the next by ten times its duration.
	_, err := b.db.ExecContext(b.ctx, "UPDATE delay_task_stats_run SET took_ms = 60000")
	if err != nil {
		t.Fatal(err)
	}
	age(5 * time.Minute)
	if got := round(); got != 0 {
		t.Fatalf("5 minutes after a count that took 1 minute: got %v, want %v", got, 0)
	}
}

// Run stops when its context ends, and has refreshed meanwhile.
func TestStatsRefresher_RunRefreshesAndStops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() {
		done <- outbox.NewStatsRefresher(b.db, outbox.StatsRefresherConfig{Interval: 10 * time.Millisecond, Logger: quiet()}).Run(ctx)
	}()
	if !testutil.Eventually(10*time.Second, 10*time.Millisecond, func() bool { return b.countRows(t, "delay_task_stats_run") == 1 }) {
		t.Fatal("no count recorded in delay_task_stats_run within 10s")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func (b *bundle) countRows(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := b.db.QueryRowContext(b.ctx, "SELECT COUNT(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestReadStats_OnADatabaseBeforeMigration4SaysToMigrate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Exec("DROP TABLE delay_task_stats_run")
	if err != nil {
		t.Fatal(err)
	}
	_, err = outbox.ReadStats(b.ctx, b.db, time.Now(), time.Second, time.Minute)
	if !errors.Is(err, outbox.ErrNotMigrated) || !strings.Contains(err.Error(), "delaybridge migrate") {
		t.Fatalf("err = %v, want ErrNotMigrated naming delaybridge migrate", err)
	}
}

// insertOverdueCases writes, beside lost (a count of) published tasks lost
// an hour ago, three more tasks an hour past due that are overdue with a
// grace of 30 s (published a moment ago, retried by a scanner just now,
// pending) and one task of each kind that is not: published ahead of a
// due time still to come, pending due within the grace, and done, dead
// or cancelled an hour past due.
func (b *bundle) insertOverdueCases(t *testing.T, lost int) {
	t.Helper()
	now := time.Now()
	hourAgo := now.Add(-time.Hour).UnixMilli()
	if _, err := b.db.ExecContext(b.ctx, fmt.Sprintf(`INSERT INTO delay_task
  (topic, task_key, due_ms, payload, state, created_ms, updated_ms, published_ms, next_attempt_ms)
SELECT 'od', CONCAT('lost-', seq), ?, '', 'published', ?, ?, ?, 0 FROM seq_1_to_%d`, lost), hourAgo, hourAgo, hourAgo, hourAgo); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key, state                  string
		due, published, nextAttempt int64
	}{
		{"published-a-moment-ago", "published", hourAgo, now.Add(-5 * time.Second).UnixMilli(), 0},
		{"retried-just-now", "published", hourAgo, hourAgo, now.UnixMilli()},
		{"published-ahead", "published", now.Add(10 * time.Second).UnixMilli(), now.Add(-40 * time.Second).UnixMilli(), 0},
		{"pending", "pending", hourAgo, 0, 0},
		{"pending-within-grace", "pending", now.Add(-10 * time.Second).UnixMilli(), 0, 0},
		{"done", "done", hourAgo, hourAgo, 0},
		{"dead", "dead", hourAgo, hourAgo, 0},
		{"cancelled", "cancelled", hourAgo, hourAgo, 0},
	} {
		if _, err := b.db.ExecContext(b.ctx, `INSERT INTO delay_task
  (topic, task_key, due_ms, payload, state, created_ms, updated_ms, published_ms, next_attempt_ms)
VALUES ('od', ?, ?, '', ?, ?, ?, ?, ?)`, c.key, c.due, c.state, hourAgo, hourAgo, c.published, c.nextAttempt); err != nil {
			t.Fatal(err)
		}
	}
}

// overdueOthers is how many tasks insertOverdueCases writes beside the
// lost ones that are overdue, and how many of those are pending.
const overdueOthers, overduePending = 3, 1

// Overdue counts unfinished tasks (pending or published) more than the
// grace past due, whenever they were last published or retried: late is
// late. It counts no task due within the grace or still to come, nor any
// finished or dead task.
func TestStats_OverdueCountsUnfinishedTasksPastDueAndTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertOverdueCases(t, 1)
	const grace = 30 * time.Second
	live, err := outbox.CountStats(b.ctx, b.db, time.Now(), grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	read, err := outbox.ReadStats(b.ctx, b.db, time.Now(), grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	const want = 1 + overdueOthers
	if live.Overdue != want || read.Overdue != want || live.OverduePending != overduePending || read.OverduePending != overduePending {
		t.Fatalf("Overdue: CountStats %d (%d pending), ReadStats %d (%d pending); want %d (%d pending)",
			live.Overdue, live.OverduePending, read.Overdue, read.OverduePending, want, overduePending)
	}
}

// Past the 10,000 tasks ReadStats looks at, the overdue count is the
// summary's, and the summary counts by the same rule.
func TestRefreshStats_OverdueBeyondTheLiveScanCountsByTheSameRule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lost = 10001
	b.insertOverdueCases(t, lost)
	const grace = 30 * time.Second
	if err := outbox.RefreshStats(b.ctx, b.db, grace); err != nil {
		t.Fatal(err)
	}
	st, err := outbox.ReadStats(b.ctx, b.db, time.Now(), grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Overdue != lost+overdueOthers {
		t.Fatalf("Overdue = %d, want the %d the summary counted", st.Overdue, lost+overdueOthers)
	}
	live, err := outbox.CountStats(b.ctx, b.db, time.Now(), grace, 0)
	if err != nil {
		t.Fatal(err)
	}
	if live.Overdue != lost+overdueOthers {
		t.Fatalf("CountStats: Overdue = %d, want %d", live.Overdue, lost+overdueOthers)
	}
}

// More than 10,000 published tasks past due, each published again a
// moment ago (as after a relay outage drains): every one is overdue. The
// summary and CountStats count them all; ReadStats without a summary says
// at least the 10,000 it read.
func TestReadStats_ManyRecentlyPublishedPastDueAreOverdue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	const n = 10001
	testenv.FillTasks(t, b.db, testenv.TaskRows{Topic: "drained", State: "published", N: n, KeyPrefix: "d-", DueMS: now.Add(-time.Hour).UnixMilli()})
	if _, err := b.db.Exec("UPDATE delay_task SET published_ms = ?", now.Add(-5*time.Second).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	const grace = 30 * time.Second
	if err := outbox.RefreshStats(b.ctx, b.db, grace); err != nil {
		t.Fatal(err)
	}
	read := func(name string, f func(context.Context, outbox.Querier, time.Time, time.Duration, time.Duration) (*outbox.Stats, error), want int) {
		t.Helper()
		st, err := f(b.ctx, b.db, time.Now(), grace, 0)
		if err != nil {
			t.Fatal(err)
		}
		if st.Overdue != want {
			t.Errorf("%s: Overdue = %d, want %d", name, st.Overdue, want)
		}
	}
	read("CountStats", outbox.CountStats, n)
	read("ReadStats with a summary", outbox.ReadStats, n)
	if _, err := b.db.Exec("DELETE FROM delay_task_stats_run"); err != nil {
		t.Fatal(err)
	}
	read("ReadStats without one", outbox.ReadStats, 10000)
}
