package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// commitSample is how often a paced run (--rate) times a commit.
const commitSample = 50 * time.Millisecond

// sampleCommits times a one-row autocommit UPDATE of bench_commits every
// commitSample until ctx ends, and returns the durations in ms.
func sampleCommits(ctx context.Context, db *sql.DB) ([]int64, error) {
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS bench_commits (id TINYINT NOT NULL PRIMARY KEY, n BIGINT NOT NULL) ENGINE = InnoDB"); err != nil {
		return nil, fmt.Errorf("bench: commit sampler: %w", err)
	}
	if _, err := db.ExecContext(ctx, "INSERT IGNORE INTO bench_commits VALUES (1, 0)"); err != nil {
		return nil, fmt.Errorf("bench: commit sampler: %w", err)
	}
	var took []int64
	t := time.NewTicker(commitSample)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return took, nil
		case <-t.C:
		}
		start := time.Now()
		if _, err := db.ExecContext(ctx, "UPDATE bench_commits SET n = n + 1 WHERE id = 1"); err != nil {
			if ctx.Err() != nil {
				return took, nil
			}
			return took, fmt.Errorf("bench: commit sampler: %w", err)
		}
		took = append(took, time.Since(start).Microseconds()/1000)
	}
}

// benchSchedule schedules tasks [first, last) in one transaction, task i
// due at anchor + delay + its share i/n of spread, and nudges relay (if
// not nil) once it committed.
func benchSchedule(ctx context.Context, db *sql.DB, run *benchRun, anchor time.Time, first, last int, delay, spread time.Duration, n int, relay *outbox.Relay, orders bool) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	// The transaction's orders and tasks go in multi-row INSERTs
	// (outbox.ScheduleMany), as a service creating many orders at once
	// would write them.
	tasks := make([]outbox.Task, 0, last-first)
	ids := make([]any, 0, last-first)
	for i := first; i < last; i++ {
		due := anchor.Add(delay)
		if spread > 0 {
			due = due.Add(time.Duration(float64(spread) * float64(i) / float64(n)))
		}
		run.due[i] = due.UnixMilli()
		ids = append(ids, run.key(i))
		tasks = append(tasks, outbox.Task{Topic: run.topic, Key: run.key(i), DueAt: due})
	}
	if orders {
		for len(ids) > 0 {
			k := min(len(ids), 500)
			if _, err := tx.ExecContext(ctx, "INSERT INTO bench_orders (id, status) VALUES "+strings.TrimSuffix(strings.Repeat("(?, 'UNPAID'),", k), ","), ids[:k]...); err != nil {
				return err
			}
			ids = ids[k:]
		}
	}
	if len(tasks) == 1 {
		if _, err := outbox.Schedule(ctx, tx, tasks[0]); err != nil {
			return err
		}
	} else if err := outbox.ScheduleMany(ctx, tx, tasks); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	committed := time.Now().UnixMilli()
	for i := first; i < last; i++ {
		run.committed[i].Store(committed)
	}
	if relay != nil {
		relay.Nudge()
	}
	return nil
}

// benchBaseline publishes n messages due at once straight through pub, in
// batches of 500 from workers goroutines, and returns the confirmed rate.
// Their keys belong to no run, so the consumer acks them unhandled.
func benchBaseline(ctx context.Context, pub broker.Publisher, topic string, n, workers int) (float64, error) {
	start := time.Now()
	next := atomic.Int64{}
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				first := int(next.Add(500)) - 500
				if first >= n {
					return
				}
				msgs := make([]*broker.Message, 0, 500)
				for i := first; i < min(first+500, n); i++ {
					msgs = append(msgs, &broker.Message{Topic: topic, Key: "baseline-" + strconv.Itoa(i), DeliverAt: broker.MillisUTC(time.Now())})
				}
				if err := pub.Publish(ctx, msgs...); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds(), firstErr
}
