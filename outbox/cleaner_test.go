package outbox_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/outbox"
)

func TestCleaner_PausesBetweenBatchesAndStopsInAPause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := time.Now().Add(-30 * 24 * time.Hour)
	for i := range 3 {
		b.schedule(t, outbox.Task{Topic: "pace", Key: fmt.Sprint(i), DueAt: old})
	}
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'done' WHERE topic = 'pace'"); err != nil {
		t.Fatal(err)
	}
	// A duty of 0.1% pauses about 999 batch times after each batch: far
	// longer than the context lives, so one batch is all this pass does.
	ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	n, err := outbox.NewCleaner(b.db, outbox.CleanerConfig{BatchSize: 1, Duty: 0.001, Logger: quiet()}).Once(ctx)
	if err != nil || n != 1 {
		t.Fatalf("Once = %d, %v; want 1 row deleted before the pause outlived the context", n, err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Once took %v after its context ended", took)
	}
	if left := b.count(t, "topic = 'pace'"); left != 2 {
		t.Fatalf("%d rows left, want 2", left)
	}
	// Duty 1 deletes back to back.
	if n, err := outbox.NewCleaner(b.db, outbox.CleanerConfig{BatchSize: 1, Duty: 1, Logger: quiet()}).Once(b.ctx); err != nil || n != 2 {
		t.Fatalf("Once = %d, %v; want the other 2", n, err)
	}
}

// BenchmarkCleaner loads DELAYBRIDGE_BENCH_CLEAN_ROWS done tasks past their
// retention into a scratch database and runs the create-order transaction
// (an order row and Schedule, one at a time) for DELAYBRIDGE_BENCH_CLEAN_TXS
// transactions (default 3000) three times: alone, beside the cleaner at its
// default duty, and beside a cleaner deleting back to back (duty 1),
// reloading the rows before each cleaner. It reports each p99 and the
// cleaner's rows/s. It is skipped without the first variable.
func BenchmarkCleaner(b *testing.B) {
	n, _ := strconv.Atoi(os.Getenv("DELAYBRIDGE_BENCH_CLEAN_ROWS"))
	if n <= 0 {
		b.Skip("set DELAYBRIDGE_BENCH_CLEAN_ROWS to the finished rows to load")
	}
	txs, _ := strconv.Atoi(os.Getenv("DELAYBRIDGE_BENCH_CLEAN_TXS"))
	if txs <= 0 {
		txs = 3000
	}
	db, _ := testenv.ScratchDB(b)
	ctx := b.Context()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL) ENGINE = InnoDB"); err != nil {
		b.Fatal(err)
	}
	load := func(tag string) {
		const week = 7 * 24 * time.Hour / time.Millisecond
		old := time.Now().Add(-8 * 24 * time.Hour).UnixMilli()
		for lo := 1; lo <= n; lo += 500_000 {
			hi := min(n, lo+499_999)
			if _, err := db.ExecContext(ctx, `INSERT INTO delay_task (topic, task_key, due_ms, payload, state, created_ms, updated_ms, published_ms, done_ms)
SELECT CONCAT('topic-', seq % 20), CONCAT(?, seq), ? - seq * ? DIV ?, REPEAT('x', 100), 'done', ?, ?, ?, ?
FROM seq_`+strconv.Itoa(lo)+`_to_`+strconv.Itoa(hi), tag, old, int64(week), n, old, old, old, old); err != nil {
				b.Fatal(err)
			}
		}
	}
	var seq atomic.Int64
	orders := func() time.Duration {
		lat := make([]time.Duration, 0, txs)
		for range txs {
			start := time.Now()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			id := fmt.Sprintf("o-%d", seq.Add(1))
			if _, err := tx.Exec("INSERT INTO orders (id, status) VALUES (?, 'UNPAID')", id); err != nil {
				b.Fatal(err)
			}
			if _, err := outbox.Schedule(ctx, tx, outbox.Task{Topic: "order-cancel", Key: id, DueAt: start.Add(30 * time.Minute), Payload: []byte(`{"order":1}`)}); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		return lat[len(lat)*99/100]
	}
	beside := func(duty float64, tag string) (time.Duration, float64) {
		load(tag)
		cl := outbox.NewCleaner(db, outbox.CleanerConfig{Duty: duty, Logger: quiet()})
		done := make(chan struct{})
		var deleted int64
		var took time.Duration
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			defer close(done)
			start := time.Now()
			deleted, _ = cl.Once(cctx)
			took = time.Since(start)
		}()
		p99 := orders()
		cancel()
		<-done
		return p99, float64(deleted) / took.Seconds()
	}
	for b.Loop() {
		alone := orders()
		paced, pacedRate := beside(outbox.DefaultCleanerDuty, "paced-")
		if _, err := db.ExecContext(ctx, "DELETE FROM delay_task WHERE task_key LIKE 'paced-%'"); err != nil {
			b.Fatal(err)
		}
		unpaced, unpacedRate := beside(1, "unpaced-")
		b.ReportMetric(float64(alone.Microseconds()), "alone_p99_us")
		b.ReportMetric(float64(paced.Microseconds()), "paced_p99_us")
		b.ReportMetric(pacedRate, "paced_rows/s")
		b.ReportMetric(float64(unpaced.Microseconds()), "unpaced_p99_us")
		b.ReportMetric(unpacedRate, "unpaced_rows/s")
	}
}

func TestCleaner_DeletesOnlyFinishedTasksPastRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := time.Now().Add(-30 * 24 * time.Hour)
	for i, st := range []string{"done", "cancelled", "pending", "published", "dead"} {
		b.schedule(t, outbox.Task{Topic: "clean", Key: "old-" + st, DueAt: old})
		b.schedule(t, outbox.Task{Topic: "clean", Key: "new-" + st, DueAt: time.Now()})
		if _, err := b.db.Exec("UPDATE delay_task SET state = ? WHERE task_key IN (?, ?)", st, "old-"+st, "new-"+st); err != nil {
			t.Fatal(err, i)
		}
	}
	n, err := outbox.NewCleaner(b.db, outbox.CleanerConfig{Retention: 7 * 24 * time.Hour, BatchSize: 1, Logger: quiet()}).Once(b.ctx)
	if err != nil || n != 2 {
		t.Fatalf("Once = %d, %v; want 2", n, err)
	}
	if left := b.count(t, "task_key IN ('old-done', 'old-cancelled')"); left != 0 {
		t.Fatalf("%d old finished tasks left", left)
	}
	if left := b.count(t, "1=1"); left != 8 {
		t.Fatalf("%d tasks left, want 8", left)
	}
}
