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

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestCleaner_PausesBetweenBatchesAndStopsInAPause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := time.Now().Add(-30 * 24 * time.Hour)
	for i := range 3 {
		b.schedule(t, outbox.Task{Topic: "pace", Key: fmt.Sprint(i), DueAt: old})
	}
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'done', updated_ms = due_ms WHERE topic = 'pace'"); err != nil {
		t.Fatal(err)
	}
	// A duty of one in a million pauses about a million batch times after
	// each batch: minutes even after a fast one, far longer than the
	// context lives, so one batch is all this pass does however slowly the
	// database answers, and the pass ends in the pause.
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	deadline, _ := ctx.Deadline()
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := outbox.NewCleaner(b.db, outbox.CleanerConfig{BatchSize: 1, Duty: 0.000001, Logger: quiet()}).Once(ctx)
		done <- result{n, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Until(deadline) + 10*time.Second):
		t.Fatal("Once still runs 10 s after its context ended: the pause does not stop with it")
	}
	// A pass that deleted more did not pause between batches; one that
	// returned before the deadline did not pause after its full batch.
	if r.err != nil || r.n != 1 {
		t.Fatalf("Once = %d, %v; want 1 row deleted before the pause outlived the context", r.n, r.err)
	}
	if early := time.Until(deadline); early > 0 {
		t.Fatalf("Once returned %v before its context ended; want it paused until then", early)
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
// retention into a scratch database, then runs the create-order transaction
// (an order row and Schedule, one at a time) DELAYBRIDGE_BENCH_CLEAN_TXS
// times (default 10000) alone and then beside the cleaner at its defaults,
// in DELAYBRIDGE_BENCH_CLEAN_ROUNDS rounds (default 3) so that each ratio
// compares measurements a few seconds apart; last, once beside a cleaner
// deleting back to back (duty 1). It reports the medians over the rounds of
// the p99 alone, the p99 beside the cleaner, their ratio and the cleaner's
// rows/s. With DELAYBRIDGE_BENCH_CLEAN_BACKGROUND=M it first loads M pending
// tasks due over the next 7 days and M done ones within retention
// (loadWeek), the table of a service at scale. It is skipped without the
// first variable.
func BenchmarkCleaner(b *testing.B) {
	n, _ := strconv.Atoi(os.Getenv("DELAYBRIDGE_BENCH_CLEAN_ROWS"))
	if n <= 0 {
		b.Skip("set DELAYBRIDGE_BENCH_CLEAN_ROWS to the finished rows to load")
	}
	txs := testenv.EnvInt("DELAYBRIDGE_BENCH_CLEAN_TXS", 10000)
	rounds := testenv.EnvInt("DELAYBRIDGE_BENCH_CLEAN_ROUNDS", 3)
	db, _ := testenv.ScratchDB(b)
	ctx := b.Context()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL) ENGINE = InnoDB"); err != nil {
		b.Fatal(err)
	}
	if bg := testenv.EnvInt("DELAYBRIDGE_BENCH_CLEAN_BACKGROUND", 0); bg > 0 {
		loadWeek(b, db, bg) // the rows the cleaner must leave: a week of waiting and of finished tasks
	}
	const week = 7 * 24 * time.Hour / time.Millisecond
	old := time.Now().Add(-8 * 24 * time.Hour).UnixMilli()
	for lo := 1; lo <= n; lo += 500_000 {
		hi := min(n, lo+499_999)
		if _, err := db.ExecContext(ctx, `INSERT INTO delay_task (topic, task_key, due_ms, payload, state, created_ms, updated_ms, published_ms, done_ms)
SELECT CONCAT('topic-', seq % 20), CONCAT('done-', seq), ? - seq * ? DIV ?, REPEAT('x', 100), 'done', ?, ?, ?, ?
FROM seq_`+strconv.Itoa(lo)+`_to_`+strconv.Itoa(hi), old, int64(week), n, old, old, old, old); err != nil {
			b.Fatal(err)
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
	// beside runs the orders beside a cleaner pass, which it stops when
	// they are done; the pass must not run out of rows before that.
	beside := func(cfg outbox.CleanerConfig) (time.Duration, float64) {
		cfg.Logger = quiet()
		cl := outbox.NewCleaner(db, cfg)
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		type result struct {
			n    int64
			took time.Duration
			err  error
		}
		done := make(chan result, 1)
		go func() {
			start := time.Now()
			n, err := cl.Once(cctx)
			done <- result{n, time.Since(start), err}
		}()
		p99 := orders()
		select {
		case r := <-done:
			b.Fatalf("the cleaner pass ended before the orders (%d rows, %v): load more rows", r.n, r.err)
		default:
		}
		cancel()
		r := <-done
		return p99, float64(r.n) / r.took.Seconds()
	}
	median := func(v []float64) float64 {
		slices.Sort(v)
		return v[len(v)/2]
	}
	for b.Loop() {
		var alone, paced, ratio, rate []float64
		for range rounds {
			time.Sleep(5 * time.Second) // let the server finish purging what the last pass deleted
			a := orders()
			p, r := beside(outbox.CleanerConfig{})
			alone = append(alone, float64(a.Microseconds()))
			paced = append(paced, float64(p.Microseconds()))
			ratio = append(ratio, float64(p)/float64(a))
			rate = append(rate, r)
		}
		time.Sleep(5 * time.Second)
		unpaced, unpacedRate := beside(outbox.CleanerConfig{Duty: 1})
		b.ReportMetric(median(alone), "alone_p99_us")
		b.ReportMetric(median(paced), "paced_p99_us")
		b.ReportMetric(median(ratio), "paced_ratio")
		b.ReportMetric(median(rate), "paced_rows/s")
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
		if _, err := b.db.Exec("UPDATE delay_task SET state = ?, updated_ms = due_ms WHERE task_key IN (?, ?)", st, "old-"+st, "new-"+st); err != nil {
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

// The retention is counted from the due time to the cleaner's clock, to the
// millisecond: a finished task due before now minus the retention goes, one
// due at that instant or later stays, and no unfinished task goes however
// old it is.
func TestCleaner_RetentionCutsAtTheMillisecond(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now().Truncate(time.Millisecond)
	const retention = 24 * time.Hour
	cutoff := now.Add(-retention)
	for _, st := range []string{"done", "cancelled"} {
		for key, due := range map[string]time.Time{
			"before": cutoff.Add(-time.Millisecond), "at": cutoff, "after": cutoff.Add(time.Millisecond),
			"an-hour-ago": now.Add(-time.Hour), "tomorrow": now.Add(retention),
		} {
			b.schedule(t, outbox.Task{Topic: st, Key: key, DueAt: due})
		}
	}
	for _, st := range []string{"pending", "published", "dead"} {
		b.schedule(t, outbox.Task{Topic: st, Key: "a-year-ago", DueAt: now.AddDate(-1, 0, 0)})
	}
	if _, err := b.db.Exec("UPDATE delay_task SET state = topic, updated_ms = due_ms"); err != nil {
		t.Fatal(err)
	}
	n, err := outbox.NewCleaner(b.db, outbox.CleanerConfig{Retention: retention, BatchSize: 1, Duty: 1, Logger: quiet(),
		Now: func() time.Time { return now }}).Once(b.ctx)
	if err != nil || n != 2 {
		t.Fatalf("Once = %d, %v; want the 2 finished tasks due a millisecond before the cutoff", n, err)
	}
	if got := b.count(t, "task_key = 'before'"); got != 0 {
		t.Fatalf("%d finished tasks due before the cutoff left", got)
	}
	if got := b.count(t, "state IN ('done', 'cancelled')"); got != 8 {
		t.Fatalf("%d finished tasks within their retention left, want 8", got)
	}
	if got := b.count(t, "state IN ('pending', 'published', 'dead')"); got != 3 {
		t.Fatalf("%d of the 3 unfinished tasks a year old left", got)
	}
}

// A retention left zero, or set negative, is the default week: never "keep
// nothing", and never a cutoff in the future.
func TestCleaner_ZeroOrNegativeRetentionKeepsTheDefaultWeek(t *testing.T) {
	t.Parallel()
	for _, retention := range []time.Duration{0, -time.Hour} {
		b := setup(t)
		now := time.Now()
		for key, due := range map[string]time.Time{
			"eight-days-ago": now.Add(-8 * 24 * time.Hour), "six-days-ago": now.Add(-6 * 24 * time.Hour),
			"a-minute-ago": now.Add(-time.Minute), "in-half-an-hour": now.Add(30 * time.Minute),
		} {
			b.schedule(t, outbox.Task{Topic: "week", Key: key, DueAt: due})
		}
		if _, err := b.db.Exec("UPDATE delay_task SET state = 'done', updated_ms = due_ms"); err != nil {
			t.Fatal(err)
		}
		n, err := outbox.NewCleaner(b.db, outbox.CleanerConfig{Retention: retention, Logger: quiet()}).Once(b.ctx)
		if err != nil || n != 1 {
			t.Fatalf("Retention %v: Once = %d, %v; want only the task due 8 days ago", retention, n, err)
		}
		if got := b.count(t, "task_key = 'eight-days-ago'"); got != 0 {
			t.Fatalf("Retention %v: the task past the default week is left", retention)
		}
	}
}

// A task that finished long after it was due (replayed from dead a week
// later, or handled after a long outage) is kept for the retention after
// it finished, like any other: a late duplicate still finds it done, and
// its key stays taken.
func TestCleaner_KeepsATaskFinishedLateForItsRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	b.schedule(t, outbox.Task{Topic: "late", Key: "replayed", DueAt: now.Add(-8 * 24 * time.Hour)})
	b.schedule(t, outbox.Task{Topic: "late", Key: "finished-long-ago", DueAt: now.Add(-8 * 24 * time.Hour)})
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'done', done_ms = ?, updated_ms = ? WHERE task_key = 'replayed'", now.UnixMilli(), now.UnixMilli()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'done', done_ms = due_ms, updated_ms = due_ms WHERE task_key = 'finished-long-ago'"); err != nil {
		t.Fatal(err)
	}
	n, err := outbox.NewCleaner(b.db, outbox.CleanerConfig{Logger: quiet()}).Once(b.ctx)
	if err != nil || n != 1 {
		t.Fatalf("Once = %d, %v; want only the task finished a week ago deleted", n, err)
	}
	if got := b.count(t, "task_key = 'replayed'"); got != 1 {
		t.Fatal("the task finished a moment ago, due 8 days ago, was deleted")
	}
}
