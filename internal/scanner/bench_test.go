package scanner_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

func handlerReads(b *testing.B, conn *sql.Conn) int64 {
	b.Helper()
	rows, err := conn.QueryContext(context.Background(), "SHOW SESSION STATUS LIKE 'Handler_read%'")
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	var total int64
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			b.Fatal(err)
		}
		total += v
	}
	return total
}

// BenchmarkRescuePass measures one scanner pass over 10k overdue published
// rows, with and without a million done rows beside them. It reports the
// InnoDB handler reads of the pass (rows_read/pass): they stay near 10k
// whatever the done rows, because the claim is a range of the (state,
// due_ms) index.
func BenchmarkRescuePass(b *testing.B) {
	for _, done := range []int{0, 1_000_000} {
		b.Run(fmt.Sprintf("done=%d", done), func(b *testing.B) {
			db, _ := testenv.ScratchDB(b)
			db.SetMaxOpenConns(1) // one connection, so session counters see the whole pass
			ctx := context.Background()
			if _, err := outbox.Migrate(ctx, db); err != nil {
				b.Fatal(err)
			}
			due := time.Now().Add(-time.Hour).UnixMilli()
			testenv.FillTasks(b, db, testenv.TaskRows{Topic: "bench", State: "done", N: done, KeyPrefix: "d", DueMS: due})
			testenv.FillTasks(b, db, testenv.TaskRows{Topic: "bench", State: "published", N: 10_000, KeyPrefix: "p", DueMS: due})
			if _, err := db.Exec("ANALYZE TABLE delay_task"); err != nil {
				b.Fatal(err)
			}
			var published int64
			pub := publishFunc(func(_ context.Context, msgs ...*broker.Message) error { published += int64(len(msgs)); return nil })
			sc, err := scanner.New(db, pub, scanner.Config{Grace: time.Second, BatchSize: 10_000, Logger: quiet()})
			if err != nil {
				b.Fatal(err)
			}
			conn, err := db.Conn(ctx)
			if err != nil {
				b.Fatal(err)
			}
			var reads int64
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				if _, err := conn.ExecContext(ctx, "UPDATE delay_task SET next_attempt_ms = 0, rescues = 0 WHERE state = 'published'"); err != nil {
					b.Fatal(err)
				}
				before := handlerReads(b, conn)
				_ = conn.Close()
				b.StartTimer()
				n, err := sc.Rescue(ctx)
				b.StopTimer()
				if err != nil || n != 10_000 {
					b.Fatalf("Rescue = %d, %v; want 10000", n, err)
				}
				if conn, err = db.Conn(ctx); err != nil {
					b.Fatal(err)
				}
				reads += handlerReads(b, conn) - before
				b.StartTimer()
			}
			b.StopTimer()
			_ = conn.Close()
			b.ReportMetric(float64(reads)/float64(b.N), "rows_read/pass")
		})
	}
}
