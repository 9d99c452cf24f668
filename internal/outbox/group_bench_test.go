package outbox_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// BenchmarkHandleGroup runs 20,000 published, due tasks through
// HandleGroup from 8 goroutines in groups of broker.DefaultGroupSize, as
// the consumer runtime does under load, and reports the tasks handled per second: with a
// handler that writes nothing (fn=none, the cost of the group commit
// itself) and with the order-timeout handler's one conditional UPDATE
// (fn=update), so the difference is what the handler's statement costs.
func BenchmarkHandleGroup(b *testing.B) {
	const (
		tasks   = 20_000
		workers = 8
		group   = broker.DefaultGroupSize
	)
	update := func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		_, err := tx.ExecContext(ctx, "UPDATE bench_orders SET status = 'CANCELLED' WHERE id = ? AND status = 'UNPAID'", m.Key)
		return err
	}
	none := func(context.Context, *sql.Tx, *broker.Message) error { return nil }
	for _, c := range []struct {
		name string
		fn   outbox.HandlerFunc
	}{{"fn=none", none}, {"fn=update", update}} {
		b.Run(c.name, func(b *testing.B) {
			scratch, dsn := testenv.ScratchDB(b)
			_ = scratch
			// As the CLI opens it: arguments interpolated, one round trip a
			// statement.
			cfg, err := mysql.ParseDSN(dsn)
			if err != nil {
				b.Fatal(err)
			}
			cfg.InterpolateParams = true
			db, err := sql.Open("mysql", cfg.FormatDSN())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = db.Close() })
			db.SetMaxOpenConns(workers + 2)
			ctx := context.Background()
			if _, err := outbox.Migrate(ctx, db); err != nil {
				b.Fatal(err)
			}
			if _, err := db.Exec("CREATE TABLE bench_orders (id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL) ENGINE = InnoDB"); err != nil {
				b.Fatal(err)
			}
			var took time.Duration
			for range b.N {
				b.StopTimer()
				for _, q := range []string{"DELETE FROM delay_task", "DELETE FROM bench_orders"} {
					if _, err := db.Exec(q); err != nil {
						b.Fatal(err)
					}
				}
				due := time.Now().Add(-time.Minute).UnixMilli()
				testenv.FillTasks(b, db, testenv.TaskRows{Topic: "group-bench", State: "published", N: tasks, KeyPrefix: "k-", DueMS: due})
				if _, err := db.Exec("INSERT INTO bench_orders (id, status) SELECT task_key, 'UNPAID' FROM delay_task"); err != nil {
					b.Fatal(err)
				}
				rows, err := db.Query("SELECT id, task_key FROM delay_task ORDER BY id")
				if err != nil {
					b.Fatal(err)
				}
				var msgs []*broker.Message
				for rows.Next() {
					m := &broker.Message{Topic: "group-bench", DeliverAt: time.UnixMilli(due)}
					var key []byte
					if err := rows.Scan(&m.TaskID, &key); err != nil {
						b.Fatal(err)
					}
					m.Key = string(key)
					msgs = append(msgs, m)
				}
				if err := rows.Err(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				next := make(chan []*broker.Message, tasks/group+1)
				for lo := 0; lo < len(msgs); lo += group {
					next <- msgs[lo:min(lo+group, len(msgs))]
				}
				close(next)
				var wg sync.WaitGroup
				for range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for g := range next {
							if _, _, err := outbox.HandleGroup(ctx, db, g, c.fn); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				took += time.Since(start)
			}
			var done int
			if err := db.QueryRow("SELECT COUNT(*) FROM delay_task WHERE state = 'done'").Scan(&done); err != nil || done != tasks {
				b.Fatalf("%d tasks done, %v; want %d", done, err, tasks)
			}
			b.ReportMetric(float64(tasks*b.N)/took.Seconds(), "tasks/s")
		})
	}
}
