package integration

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// BenchmarkScanner_RecoveryAfterBrokerLoss publishes 100,000 tasks, destroys
// every copy in RabbitMQ, then starts the consumer (batched Handle) and one
// scanner with its defaults but a 1s grace, and reports the seconds until all
// are handled (recovery_s) and the rescue rate.
//
//	go test -run '^$' -bench ScannerRecovery -benchtime 1x -timeout 30m ./integration/
func BenchmarkScanner_RecoveryAfterBrokerLoss(b *testing.B) {
	const n = 100_000
	for range b.N {
		b.StopTimer()
		ad := rabbitAdapter(b)
		f := newFlow(b)
		pub, sub := ad.open(b, f.topic)
		due := time.Now().Add(2 * time.Second).UnixMilli()
		// Bulk-load the tasks and their orders with MariaDB's sequence engine.
		if _, err := f.db.Exec(fmt.Sprintf(`INSERT INTO orders (id, status) SELECT CONCAT('r-', seq), 'UNPAID' FROM seq_1_to_%d`, n)); err != nil {
			b.Fatal(err)
		}
		if _, err := f.db.Exec(fmt.Sprintf(`INSERT INTO delay_task (topic, task_key, due_ms, payload, state, created_ms, updated_ms)
SELECT ?, CONCAT('r-', seq), ?, '', 'pending', ?, ? FROM seq_1_to_%d`, n), f.topic, due, due, due); err != nil {
			b.Fatal(err)
		}
		r, err := outbox.NewRelay(f.db, pub, outbox.RelayConfig{Logger: quiet()})
		if err != nil {
			b.Fatal(err)
		}
		for f.count(b, "SELECT COUNT(*) FROM delay_task WHERE state = 'pending'") > 0 {
			if _, err := r.Once(f.ctx); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(time.Until(time.UnixMilli(due).Add(time.Second)))
		ad.lose(b, f.topic)

		b.StartTimer()
		start := time.Now()
		c, err := outbox.NewConsumer(f.db, sub, pub, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
			_, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'CANCELLED', effects = effects + 1 WHERE id = ? AND status = 'UNPAID'", m.Key)
			return err
		}, broker.ConsumerConfig{Logger: quiet(), Concurrency: 16, GroupSize: 100})
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Start(f.ctx, f.topic); err != nil {
			b.Fatal(err)
		}
		sc, err := scanner.New(f.db, pub, scanner.Config{Logger: quiet(), Grace: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(f.ctx)
		done := make(chan struct{})
		go func() { _ = sc.Run(ctx); close(done) }()
		if !testutil.Eventually(20*time.Minute, 200*time.Millisecond, func() bool {
			return f.count(b, "SELECT COUNT(*) FROM delay_task WHERE state = 'done'") >= n
		}) {
			b.Fatal("not recovered in 20 minutes")
		}
		took := time.Since(start)
		b.StopTimer()
		cancel()
		<-done
		_ = c.Close(context.Background())
		if dup := f.count(b, "SELECT COUNT(*) FROM orders WHERE effects <> 1"); dup != 0 {
			b.Fatalf("%d orders not cancelled exactly once", dup)
		}
		b.ReportMetric(took.Seconds(), "recovery_s")
		b.ReportMetric(float64(n)/took.Seconds(), "tasks/s")
	}
}
