package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// BenchmarkOrderTransaction measures the order service's create-order
// transaction with and without outbox.Schedule in it, one transaction at a
// time, and reports the median latency (p50_us): the difference is what
// Schedule adds.
func BenchmarkOrderTransaction(b *testing.B) {
	for _, withTask := range []bool{false, true} {
		name := "order-only"
		if withTask {
			name = "order+schedule"
		}
		b.Run(name, func(b *testing.B) {
			db, _ := testenv.ScratchDB(b)
			ctx := context.Background()
			if _, err := outbox.Migrate(ctx, db); err != nil {
				b.Fatal(err)
			}
			if _, err := db.Exec("CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL) ENGINE = InnoDB"); err != nil {
				b.Fatal(err)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				id := fmt.Sprintf("o-%d", i)
				if _, err := tx.Exec("INSERT INTO orders (id, status) VALUES (?, 'UNPAID')", id); err != nil {
					b.Fatal(err)
				}
				if withTask {
					if _, err := outbox.Schedule(ctx, tx, outbox.Task{Topic: "order-cancel", Key: id, DueAt: start.Add(30 * time.Minute), Payload: []byte(`{"order":1}`)}); err != nil {
						b.Fatal(err)
					}
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50_us")
		})
	}
}
