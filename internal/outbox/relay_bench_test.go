package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// instantPublisher confirms every message at once: with it the relay's rate
// is what the database allows, the ceiling any broker run sits under.
type instantPublisher struct{}

func (instantPublisher) Publish(context.Context, ...*broker.Message) error { return nil }
func (instantPublisher) Limits() broker.Limits                             { return broker.Limits{} }
func (instantPublisher) Close() error                                      { return nil }

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
				testenv.FillTasks(b, db, testenv.TaskRows{Topic: "relay-bench", State: "pending", N: rows, KeyPrefix: "k-",
					DueMS: time.Now().Add(time.Hour).UnixMilli(), Payload: []byte(`{"order":"o-1234567890"}`)})
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
