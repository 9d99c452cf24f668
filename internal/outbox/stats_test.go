package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// counts is the part of Stats the summary holds.
type counts struct {
	Backlog               map[outbox.State]map[string]int
	Done, Cancelled, Dead int
	Overdue               int
}

func countsOf(st *ops.Stats) counts {
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
	summary, err := ops.ReadStats(b.ctx, b.db, now, grace, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	live, err := ops.CountStats(b.ctx, b.db, now, grace, time.Hour)
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
