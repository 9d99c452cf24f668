package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/memory"
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
	require.NoError(t, err)
	require.Equal(t, 10, n, "relayed")
	for _, m := range orders[:3] {
		o, err := outbox.Handle(b.ctx, b.db, m, cancelOrder(m.Key))
		require.NoError(t, err)
		require.Equal(t, outbox.Handled, o)
	}
	require.NoError(t, outbox.Cancel(b.ctx, b.db, "mail", "m0"))
	b.schedule(t, outbox.Task{Topic: "mail", Key: "m4", DueAt: time.Now().Add(time.Hour)})
	for _, q := range []string{
		"UPDATE delay_task SET state = 'dead' WHERE task_key = 'o3'",
		"UPDATE delay_task SET published_ms = published_ms - 3600000, next_attempt_ms = 0 WHERE task_key = 'o4'",
	} {
		_, err := b.db.ExecContext(b.ctx, q)
		require.NoError(t, err, q)
	}
}

func TestRefreshStats_SummaryEqualsALiveCountAfterTraffic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	traffic(t, b)
	const grace = 30 * time.Second

	require.NoError(t, outbox.RefreshStats(b.ctx, b.db, grace))
	now := time.Now()
	summary, err := outbox.ReadStats(b.ctx, b.db, now, grace, time.Hour)
	require.NoError(t, err)
	live, err := outbox.CountStats(b.ctx, b.db, now, grace, time.Hour)
	require.NoError(t, err)

	want := counts{
		Backlog: map[outbox.State]map[string]int{
			outbox.StatePending:   {"mail": 1},
			outbox.StatePublished: {"order-cancel": 2, "mail": 3},
			outbox.StateDead:      {"order-cancel": 1},
		},
		Done: 3, Cancelled: 1, Dead: 1, Overdue: 1,
	}
	require.Equal(t, want, countsOf(live), "live count")
	require.Equal(t, want, countsOf(summary), "summary")
	require.False(t, summary.Live)
	require.True(t, live.Live)
	require.Equal(t, live.OldestPendingDue, summary.OldestPendingDue)
	require.Equal(t, live.Lateness, summary.Lateness)
	require.Equal(t, 3, summary.Lateness.Count)
}

// The summary is what the last refresh counted, not what is there now, and
// says how old it is.
func TestReadStats_StaleSummaryReportsItsAge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, outbox.Task{Topic: "t", Key: "before", DueAt: time.Now().Add(time.Hour)})
	require.NoError(t, outbox.RefreshStats(b.ctx, b.db, time.Second))
	_, err := b.db.ExecContext(b.ctx, "UPDATE delay_task_stats_run SET computed_ms = computed_ms - 3600000")
	require.NoError(t, err)
	b.schedule(t, outbox.Task{Topic: "t", Key: "after", DueAt: time.Now().Add(time.Hour)})

	st, err := outbox.ReadStats(b.ctx, b.db, time.Now(), time.Second, 0)
	require.NoError(t, err)
	require.Equal(t, 1, st.Backlog[outbox.StatePending]["t"], "the summary counts what the refresh saw")
	require.GreaterOrEqual(t, st.CountsAge, time.Hour)
	require.Less(t, st.CountsAge, time.Hour+time.Minute)
	require.WithinDuration(t, time.Now().Add(-time.Hour), st.CountsAt, time.Minute)
}

// Before any refresh ReadStats has no counts to give, and says so with a
// zero CountsAt rather than zeros that read as an empty outbox.
func TestReadStats_WithoutSummaryHasNoCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	b.schedule(t, outbox.Task{Topic: "t", Key: "k", DueAt: due})
	st, err := outbox.ReadStats(b.ctx, b.db, time.Now(), time.Second, time.Minute)
	require.NoError(t, err)
	require.True(t, st.CountsAt.IsZero())
	require.Empty(t, st.Backlog)
	require.True(t, st.OldestPendingDue.Equal(due), "live figures are still read: %v", st.OldestPendingDue)
}

// lockName is the lock StatsRefresher documents: delaybridge_stats_ and
// the MD5 of the database name.
func lockName(t *testing.T, db *sql.DB) string {
	t.Helper()
	var name string
	require.NoError(t, db.QueryRow("SELECT CONCAT('delaybridge_stats_', MD5(DATABASE()))").Scan(&name))
	return name
}

func TestStatsRefresher_SkipsWhileAnotherHoldsTheLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder, err := b.db.Conn(b.ctx)
	require.NoError(t, err)
	defer holder.Close()
	var got int
	require.NoError(t, holder.QueryRowContext(b.ctx, "SELECT GET_LOCK(?, 0)", lockName(t, b.db)).Scan(&got))
	require.Equal(t, 1, got)

	r := outbox.NewStatsRefresher(b.db, outbox.StatsRefresherConfig{Logger: quiet()})
	ran, err := r.Once(b.ctx)
	require.NoError(t, err)
	require.False(t, ran, "refreshed while another process held the lock")
	require.Zero(t, b.countRows(t, "delay_task_stats_run"))

	_, err = holder.ExecContext(b.ctx, "SELECT RELEASE_LOCK(?)", lockName(t, b.db))
	require.NoError(t, err)
	ran, err = r.Once(b.ctx)
	require.NoError(t, err)
	require.True(t, ran, "did not refresh once the lock was free")
	require.Equal(t, 1, b.countRows(t, "delay_task_stats_run"))
}

// Two daemons' refreshers, started together and again and again, count
// once per interval between them.
func TestStatsRefresher_TwoRefreshersCountOncePerInterval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	cfg := outbox.StatsRefresherConfig{Interval: time.Minute, Logger: quiet(), Now: clock}
	refreshers := []*outbox.StatsRefresher{outbox.NewStatsRefresher(b.db, cfg), outbox.NewStatsRefresher(b.db, cfg)}
	round := func() int {
		var wg sync.WaitGroup
		ran := make([]bool, len(refreshers))
		for i, r := range refreshers {
			wg.Go(func() {
				var err error
				ran[i], err = r.Once(b.ctx)
				require.NoError(t, err)
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
	require.Equal(t, 1, round(), "first round")
	require.Equal(t, 0, round(), "a round within the interval")
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	require.Equal(t, 1, round(), "a round after the interval")

	// A count that took long spaces the next by ten times its duration.
	_, err := b.db.ExecContext(b.ctx, "UPDATE delay_task_stats_run SET took_ms = 60000")
	require.NoError(t, err)
	mu.Lock()
	now = now.Add(5 * time.Minute)
	mu.Unlock()
	require.Equal(t, 0, round(), "5 minutes after a count that took 1 minute")
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
	require.Eventually(t, func() bool { return b.countRows(t, "delay_task_stats_run") == 1 }, 10*time.Second, 10*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func (b *bundle) countRows(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRowContext(b.ctx, "SELECT COUNT(*) FROM "+table).Scan(&n))
	return n
}

func TestReadStats_OnADatabaseBeforeMigration4SaysToMigrate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Exec("DROP TABLE delay_task_stats_run")
	require.NoError(t, err)
	_, err = outbox.ReadStats(b.ctx, b.db, time.Now(), time.Second, time.Minute)
	require.ErrorIs(t, err, outbox.ErrNotMigrated)
	require.Contains(t, err.Error(), "delaybridge migrate")
}
