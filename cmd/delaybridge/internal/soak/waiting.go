package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/outbox"
)

// WaitingTopic holds the tasks --waiting loads: the seeds' millions
// waiting, due only after the soak has ended. Nothing consumes it: soak
// deletes them when it ends, and again when it starts, in case a soak
// was killed.
const WaitingTopic = "soak-waiting"

// Waiting tasks fall due in a spread window that starts waitingMargin
// after the soak would end if it started as each batch is written, so a
// load slower than the margin is the only way one falls due during the
// soak, and load checks for it.
const (
	waitingMargin   = 10 * time.Minute
	waitingSpread   = 30 * time.Minute
	waitingBatch    = 5000
	waitingWriters  = 4
	waitingDeleteBy = 10000
)

// loadWaiting writes o.waiting tasks of WaitingTopic, due after the soak,
// in transactions of waitingBatch from waitingWriters connections. It
// returns when they are all written, or with the first error.
func (s *soak) loadWaiting(ctx context.Context) error {
	total := s.o.waiting
	if total == 0 {
		return nil
	}
	lasts := s.o.duration + s.o.timeout + s.o.settle
	start := time.Now()
	fmt.Fprintf(s.env.Stderr, "soak: loading %d waiting tasks (topic %s), due after the soak\n", total, WaitingTopic)
	var next atomic.Int64
	errs := make(chan error, waitingWriters)
	var wg sync.WaitGroup
	for range waitingWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tasks := make([]outbox.Task, 0, waitingBatch)
			for {
				from := next.Add(waitingBatch) - waitingBatch
				if from >= int64(total) || ctx.Err() != nil {
					return
				}
				tasks = tasks[:0]
				base := time.Now().Add(lasts + waitingMargin)
				for i := from; i < min(from+waitingBatch, int64(total)); i++ {
					key := s.id + "-w" + strconv.FormatInt(i, 10)
					tasks = append(tasks, outbox.Task{Topic: WaitingTopic, Key: key, DueAt: base.Add(rand.N(waitingSpread)),
						Payload: []byte(`{"order":"` + key + `"}`)})
				}
				if err := s.scheduleWaiting(ctx, tasks); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("soak: load waiting tasks: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	took := time.Since(start)
	if took >= waitingMargin {
		return fmt.Errorf("soak: loading %d waiting tasks took %v, more than the %v margin before they fall due: load fewer", total, took.Round(time.Second), waitingMargin)
	}
	fmt.Fprintf(s.env.Stderr, "soak: loaded %d waiting tasks in %.1f s\n", total, took.Seconds())
	return nil
}

// scheduleWaiting writes one batch in a transaction of its own.
func (s *soak) scheduleWaiting(ctx context.Context, tasks []outbox.Task) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := outbox.ScheduleMany(ctx, tx, tasks); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// deleteWaiting deletes every task of WaitingTopic, waitingDeleteBy rows
// a statement so no transaction holds millions of row locks. A statement
// the server picks as a deadlock's victim (another soak deleting the same
// rows) runs again.
func (s *soak) deleteWaiting(ctx context.Context) error {
	deleted := int64(0)
	start := time.Now()
	for victims := 0; ; {
		res, err := s.db.ExecContext(ctx, "DELETE FROM delay_task WHERE topic = ? LIMIT ?", WaitingTopic, waitingDeleteBy)
		if me := (*mysql.MySQLError)(nil); errors.As(err, &me) && me.Number == 1213 && victims < 10 {
			victims++
			continue
		}
		if err != nil {
			return fmt.Errorf("soak: delete the waiting tasks: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("soak: delete the waiting tasks: %w", err)
		}
		deleted += n
		if n < waitingDeleteBy {
			break
		}
	}
	if deleted > 0 {
		fmt.Fprintf(s.env.Stderr, "soak: deleted %d waiting tasks in %.1f s\n", deleted, time.Since(start).Seconds())
	}
	return nil
}
