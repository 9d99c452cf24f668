package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// markChecked is a handler's write that must commit with its snooze: the
// order service notes that it asked the payment channel.
func markChecked(ctx context.Context, tx *sql.Tx, id string) error {
	_, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'CHECKED' WHERE id = ?", id)
	return err
}

// snoozed checks what a snooze leaves on the task of key: pending again
// in a new generation, due no earlier than after from the start of the
// run, one more snooze, no attempt counted, the reason kept.
func (b *bundle) snoozed(t *testing.T, key string, before time.Time, after time.Duration, gen int64, snoozes int) {
	t.Helper()
	info, err := outbox.Get(b.ctx, b.db, "order-cancel", key)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != outbox.StatePending || info.Generation != gen || info.Snoozes != snoozes || info.Attempts != 0 ||
		info.Task.DueAt.Before(before.Add(after).Truncate(time.Millisecond)) || info.Task.DueAt.After(time.Now().Add(after+time.Millisecond)) ||
		!strings.HasPrefix(info.LastError, "snoozed: payment pending") {
		t.Fatalf("%s after a snooze of %v: %+v", key, after, info)
	}
	if status, cancels := b.orderRow(t, key); status != "CHECKED" || cancels != 0 {
		t.Fatalf("%s: order %s, cancelled %d times; want the handler's write kept and no cancel", key, status, cancels)
	}
}

// A handler that snoozes keeps what it wrote, and its task moves to its
// new time in the same transaction; the message in hand is then stale.
func TestSnooze_MovesTheTaskInTheHandlersTransactionAndIsNoAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o", time.Now().Add(-time.Millisecond))
	start := time.Now()
	got, err := outbox.Handle(b.ctx, b.db, msg, func(ctx context.Context, tx *sql.Tx) error {
		if err := markChecked(ctx, tx, "o"); err != nil {
			return err
		}
		return outbox.Snooze(30*time.Second, "payment pending at the channel")
	})
	if err != nil || got != outbox.Snoozed || got.SkipReason() != "snoozed" {
		t.Fatalf("Handle = %v, %v; want Snoozed", got, err)
	}
	b.snoozed(t, "o", start, 30*time.Second, 1, 1)
	if again, err := outbox.Handle(b.ctx, b.db, msg, cancelOrder("o")); err != nil || again != outbox.SkippedStale {
		t.Fatalf("the snoozed message again: %v, %v; want SkippedStale", again, err)
	}
	// Rescheduling starts the count again.
	if err := outbox.Reschedule(b.ctx, b.db, "order-cancel", "o", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", "o"); info.Snoozes != 0 {
		t.Fatalf("snoozes %d after a reschedule, want 0", info.Snoozes)
	}
}

// In a group, the message that snoozes moves on alone; the others are
// done. That holds on the first run and on the run with savepoints that
// follows a failure.
func TestSnooze_InAGroupMovesOnlyItsOwnTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := []string{"a", "wait", "c", "poison"}
	var msgs []*broker.Message
	for _, k := range keys {
		msgs = append(msgs, b.order(t, k, time.Now().Add(-time.Millisecond)))
	}
	start := time.Now()
	fn := func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		switch m.Key {
		case "wait":
			if err := markChecked(ctx, tx, m.Key); err != nil {
				return err
			}
			return outbox.Snooze(time.Minute, "payment pending")
		case "poison":
			return errors.New("bad order")
		}
		return cancelOne(ctx, tx, m)
	}
	results, errs, err := outbox.HandleGroup(b.ctx, b.db, msgs, fn)
	if err != nil {
		t.Fatal(err)
	}
	want := []outbox.HandleResult{outbox.Handled, outbox.Snoozed, outbox.Handled}
	for i, w := range want {
		if results[i] != w || errs[i] != nil {
			t.Errorf("%s: %v, %v; want %v", keys[i], results[i], errs[i], w)
		}
	}
	if errs[3] == nil {
		t.Error("poison: no error")
	}
	b.snoozed(t, "wait", start, time.Minute, 1, 1)
	for _, k := range []string{"a", "c"} {
		if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", k); info.State != outbox.StateDone {
			t.Errorf("%s: %s, want done", k, info.State)
		}
	}
}

// A task snoozes at most MaxSnoozes times: the next snooze is a
// permanent failure, which sends the task to dead, and nothing of that
// run is kept.
func TestSnooze_PastTheBoundIsAPermanentFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o", time.Now().Add(-time.Millisecond))
	if _, err := b.db.Exec("UPDATE delay_task SET snoozes = ? WHERE task_key = 'o'", outbox.MaxSnoozes); err != nil {
		t.Fatal(err)
	}
	_, err := outbox.Handle(b.ctx, b.db, msg, func(ctx context.Context, tx *sql.Tx) error {
		if err := markChecked(ctx, tx, "o"); err != nil {
			return err
		}
		return outbox.Snooze(time.Minute, "payment pending")
	})
	if !broker.IsPermanent(err) || !strings.Contains(err.Error(), "payment pending") {
		t.Fatalf("Handle = %v; want a permanent error naming the last reason", err)
	}
	info, _ := outbox.Get(b.ctx, b.db, "order-cancel", "o")
	if info.Snoozes != outbox.MaxSnoozes || info.Generation != 0 {
		t.Fatalf("after the refused snooze: %+v", info)
	}
	if status, _ := b.orderRow(t, "o"); status != "UNPAID" {
		t.Fatalf("order %s; the refused run's write must roll back", status)
	}
}

// RunNow's handler may snooze too: the task moves on in the caller's
// transaction and RunNow reports that it did not run.
func TestSnooze_FromRunNowMovesTheTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "o", time.Now().Add(-time.Millisecond))
	start := time.Now()
	ran, err := b.runNow(t, "o", func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		if err := markChecked(ctx, tx, "o"); err != nil {
			return err
		}
		return outbox.Snooze(10*time.Second, "payment pending")
	})
	if ran || err != nil {
		t.Fatalf("RunNow = %v, %v; want not run, no error", ran, err)
	}
	b.snoozed(t, "o", start, 10*time.Second, 1, 1)
}

// A snooze longer than a task may wait is a permanent failure, not a due
// time that overflows or that no broker carries.
func TestSnooze_LongerThanATaskMayWaitIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i, d := range []time.Duration{broker.DefaultMaxDelay + time.Hour, time.Duration(1<<63 - 1)} {
		key := fmt.Sprintf("o-%d", i)
		msg := b.order(t, key, time.Now().Add(-time.Millisecond))
		_, err := outbox.Handle(b.ctx, b.db, msg, func(context.Context, *sql.Tx) error { return outbox.Snooze(d, "later") })
		if !broker.IsPermanent(err) {
			t.Errorf("snooze of %v: %v; want a permanent error", d, err)
		}
		if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", key); info.Generation != 0 || info.Snoozes != 0 {
			t.Errorf("snooze of %v changed the task: %+v", d, info)
		}
	}
}
