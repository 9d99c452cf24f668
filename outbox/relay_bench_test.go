package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/outbox"
)

// instantPublisher confirms every message at once: with it the relay's rate
// is what the database allows, the ceiling any broker run sits under.
type instantPublisher struct{}

func (instantPublisher) Publish(context.Context, ...*broker.Message) error { return nil }
func (instantPublisher) Limits() broker.Limits                             { return broker.Limits{} }
func (instantPublisher) Close() error                                      { return nil }

// fillPending inserts n pending rows due in an hour, 1,000 per statement.
func fillPending(b *testing.B, db *sql.DB, n int) {
	b.Helper()
	due := time.Now().Add(time.Hour).UnixMilli()
	for first := 0; first < n; first += 1000 {
		rows := min(1000, n-first)
		var q strings.Builder
		q.WriteString("INSERT INTO delay_task (topic, task_key, due_ms, payload, state, created_ms, updated_ms) VALUES ")
		args := make([]any, 0, rows*3)
		for i := range rows {
			if i > 0 {
				q.WriteString(",")
			}
			q.WriteString("('relay-bench', ?, ?, ?, 'pending', 0, 0)")
			args = append(args, fmt.Sprintf("k-%d", first+i), due+int64(first+i), []byte(`{"order":"o-1234567890"}`))
		}
		if _, err := db.Exec(q.String(), args...); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRelayDatabase drains 200,000 pending rows through a publisher
// that confirms at once, and reports the rows relayed per second: the
// database's share of the relay, without any broker.
func BenchmarkRelayDatabase(b *testing.B) {
	const rows = 200_000
	for _, workers := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			db, _ := testenv.ScratchDB(b)
			ctx := context.Background()
			if _, err := outbox.Migrate(ctx, db); err != nil {
				b.Fatal(err)
			}
			var took time.Duration
			for range b.N {
				b.StopTimer()
				if _, err := db.Exec("DELETE FROM delay_task"); err != nil {
					b.Fatal(err)
				}
				fillPending(b, db, rows)
				b.StartTimer()
				r, err := outbox.NewRelay(db, instantPublisher{}, outbox.RelayConfig{Workers: workers, Logger: quiet()})
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				runCtx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- r.Run(runCtx) }()
				for {
					var left int
					if err := db.QueryRow("SELECT COUNT(*) FROM delay_task WHERE state = 'pending'").Scan(&left); err != nil {
						b.Fatal(err)
					}
					if left == 0 {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				took += time.Since(start)
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(rows*b.N)/took.Seconds(), "rows/s")
		})
	}
}
