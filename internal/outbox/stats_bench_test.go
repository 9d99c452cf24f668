package outbox_test

import (
	"database/sql"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// BenchmarkStats loads DELAYBRIDGE_BENCH_STATS_ROWS pending tasks (due over
// the next 7 days) and as many done ones (due over the last 7 days, the
// default retention) across 20 topics into a scratch database, then
// measures what status and a metrics scrape cost (ReadStats from the
// summary), the background count (RefreshStats), and a live count
// (CountStats) for comparison. It is skipped without that variable:
// loading a million rows takes about a minute.
func BenchmarkStats(b *testing.B) {
	n, _ := strconv.Atoi(os.Getenv("DELAYBRIDGE_BENCH_STATS_ROWS"))
	if n <= 0 {
		b.Skip("set DELAYBRIDGE_BENCH_STATS_ROWS to the pending (and done) rows to load")
	}
	db, _ := testenv.ScratchDB(b)
	ctx := b.Context()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	loadWeek(b, db, n)
	b.Logf("loaded %d pending + %d done rows in %v", n, n, time.Since(start).Round(time.Second))

	b.Run("RefreshStats", func(b *testing.B) {
		for b.Loop() {
			if err := outbox.RefreshStats(ctx, db, 30*time.Second); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ReadStats/status", func(b *testing.B) {
		for b.Loop() {
			st, err := ops.ReadStats(ctx, db, time.Now(), 30*time.Second, 10*time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if st.Backlog[outbox.StatePending]["topic-1"] == 0 || st.Done != n {
				b.Fatalf("stats %+v", st)
			}
		}
	})
	b.Run("ReadStats/metrics", func(b *testing.B) {
		for b.Loop() {
			if _, err := ops.ReadStats(ctx, db, time.Now(), 30*time.Second, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("CountStats", func(b *testing.B) {
		for b.Loop() {
			if _, err := ops.CountStats(ctx, db, time.Now(), 30*time.Second, 10*time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// loadWeek writes n pending tasks due over the next 7 days and n done ones
// due over the last 7 days (the default retention) across 20 topics, then
// analyzes the table, as a server that has seen the writes would have.
// MariaDB's SEQUENCE engine generates the rows server-side, in chunks that
// keep each transaction moderate.
func loadWeek(b *testing.B, db *sql.DB, n int) {
	b.Helper()
	ctx := b.Context()
	const week = 7 * 24 * time.Hour / time.Millisecond
	now := time.Now().UnixMilli()
	const chunk = 500_000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(n, lo+chunk-1)
		seq := "seq_" + strconv.Itoa(lo) + "_to_" + strconv.Itoa(hi)
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{`INSERT INTO delay_task (topic, task_key, due_ms, payload, state, created_ms, updated_ms)
SELECT CONCAT('topic-', seq % 20), CONCAT('p-', seq), ? + seq * ? DIV ?, REPEAT('x', 100), 'pending', ?, ?
FROM ` + seq, []any{now, int64(week), n, now, now}},
			{`INSERT INTO delay_task (topic, task_key, due_ms, payload, state, created_ms, updated_ms, published_ms, done_ms)
SELECT CONCAT('topic-', seq % 20), CONCAT('d-', seq), ? - seq * ? DIV ?, REPEAT('x', 100), 'done', ?, ?, ?, ? - seq * ? DIV ? + 50
FROM ` + seq, []any{now, int64(week), n, now, now, now, now, int64(week), n}},
		} {
			if _, err := db.ExecContext(ctx, q.sql, q.args...); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := db.ExecContext(ctx, "ANALYZE TABLE delay_task"); err != nil {
		b.Fatal(err)
	}
}
