package outbox_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/store"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// BenchmarkScale loads DELAYBRIDGE_BENCH_SCALE_ROWS pending tasks due over
// the next 7 days and as many done ones within the default retention
// (loadWeek; 0 is allowed: an empty table) into a scratch database, and
// measures what one task costs at that size: the create-order transaction
// with Schedule (3,000 of them, one at a time: p50 and p99), one relay
// claim of 1,000 due rows (which marks them published), and the table's bytes on
// disk per row, once the server has flushed the load. It is skipped
// without the variable.
func BenchmarkScale(b *testing.B) {
	env, ok := os.LookupEnv("DELAYBRIDGE_BENCH_SCALE_ROWS")
	if !ok {
		b.Skip("set DELAYBRIDGE_BENCH_SCALE_ROWS to the pending (and done) rows to load, 0 for none")
	}
	n, err := strconv.Atoi(env)
	if err != nil || n < 0 {
		b.Fatalf("DELAYBRIDGE_BENCH_SCALE_ROWS=%q: want a row count", env)
	}
	db, _ := testenv.ScratchDB(b)
	ctx := b.Context()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL) ENGINE = InnoDB"); err != nil {
		b.Fatal(err)
	}
	if n > 0 {
		start := time.Now()
		loadWeek(b, db, n)
		b.Logf("loaded %d pending + %d done rows in %v", n, n, time.Since(start).Round(time.Second))
		// Measure the steady state, not the server writing the load out:
		// wait (at most 3 minutes) until the buffer pool's dirty pages
		// are flushed.
		testutil.Eventually(3*time.Minute, 2*time.Second, func() bool {
			var name string
			var dirty int
			if err := db.QueryRow("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'").Scan(&name, &dirty); err != nil {
				b.Fatal(err)
			}
			return dirty < 1000
		})
		b.Logf("settled after %v", time.Since(start).Round(time.Second))
	}
	for b.Loop() {
		lat := make([]time.Duration, 0, 3000)
		for i := range 3000 {
			start := time.Now()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			id := fmt.Sprintf("o-%d-%d", b.N, i)
			if _, err := tx.Exec("INSERT INTO orders (id, status) VALUES (?, 'UNPAID')", id); err != nil {
				b.Fatal(err)
			}
			// Due within the next seconds, so the relay's claim below finds
			// them at the head of the index, as it finds due work at any size.
			if _, err := outbox.Schedule(ctx, tx, outbox.Task{Topic: "order-cancel", Key: id, DueAt: start.Add(-time.Second), Payload: []byte(`{"order":1}`)}); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "schedule_p50_us")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "schedule_p99_us")

		start := time.Now()
		owner := store.NewLeaseOwner()
		now := time.Now()
		claimed, err := store.ClaimLeased(ctx, db, store.ClaimSpec{State: store.Pending, DueAtMost: now.UnixMilli(), ReadyAtMost: now.UnixMilli(),
			PublishedAtMost: 1<<63 - 1, Limit: 1000, Owner: owner, LeaseUntil: now.Add(time.Minute).UnixMilli(), HandOffAt: now.UnixMilli()})
		if err != nil || len(claimed) != 1000 {
			b.Fatalf("claim: %d rows, %v", len(claimed), err)
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "relay_us/task")
	}
	var rows, bytes int64
	if err := db.QueryRow(`SELECT TABLE_ROWS, DATA_LENGTH + INDEX_LENGTH FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'delay_task'`).Scan(&rows, &bytes); err != nil {
		b.Fatal(err)
	}
	if rows > 0 {
		b.ReportMetric(float64(bytes)/float64(rows), "disk_bytes/row")
	}
}
