package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/store"
)

// MaxSnoozes is how many times a task may snooze (Snooze) before the next
// snooze sends it to dead instead: a handler that says "not yet" for ever
// stops there, with its reason, for an operator to look at.
const MaxSnoozes = 100

// maxSnoozeReason is the longest reason kept on the row, in bytes.
const maxSnoozeReason = 512

// SnoozeError is what Snooze returns: the handler's "not yet, look again
// after After", with its reason.
type SnoozeError struct {
	After  time.Duration
	Reason string
}

func (e *SnoozeError) Error() string {
	return fmt.Sprintf("snoozed for %v: %s", e.After, e.Reason)
}

// Snooze is what a handler returns to run its task again after d, for
// reason: the payment channel says "pending", say. The task moves to now
// plus d by the database's clock, in the handler's transaction, which
// commits with it; the message in hand is acked and a new one is
// published for the new time. A snooze is not a failed attempt and costs
// no retry, but a task may snooze at most MaxSnoozes times; the next one
// sends it to dead. The reason is kept on the task (its last error) and
// shown by `delaybridge task show` and the console. d must be at least a
// millisecond; a shorter one counts as one.
func Snooze(d time.Duration, reason string) error {
	return &SnoozeError{After: max(d, time.Millisecond), Reason: reason}
}

// snoozeOf returns the snooze err carries, if any.
func snoozeOf(err error) (*SnoozeError, bool) {
	var s *SnoozeError
	ok := errors.As(err, &s)
	return s, ok
}

// snooze records s on the locked task row r in tx: the due time moves to
// the database's now plus s.After in a new generation, so the message in
// hand and any other copy of it are skipped, and the relay publishes the
// task again for its new time. It returns an error for the caller to
// treat as the handler's failure once the task has snoozed MaxSnoozes
// times: a permanent one, so the task goes dead with its reason.
func snooze(ctx context.Context, tx *sql.Tx, r *taskRow, s *SnoozeError) error {
	if s.After > broker.DefaultMaxDelay {
		return broker.Permanent(fmt.Errorf("outbox: snooze of %v is longer than a task may wait (%v): %s", s.After, broker.DefaultMaxDelay, s.Reason))
	}
	if r.snoozes >= MaxSnoozes {
		return broker.Permanent(fmt.Errorf("outbox: snoozed %d times, the most a task may (MaxSnoozes); the last reason: %s", r.snoozes, s.Reason))
	}
	now := time.Now().UnixMilli()
	if _, err := tx.ExecContext(ctx, `UPDATE delay_task SET due_ms = `+store.DBNowMS+` + ?, generation = generation + 1, state = 'pending',
    snoozes = snoozes + 1, last_error = ?, publish_attempts = 0, next_attempt_ms = 0, published_ms = 0, lease_owner = 0, updated_ms = ?
WHERE id = ?`, int64((s.After+time.Millisecond-1)/time.Millisecond), store.Truncate("snoozed: "+s.Reason, maxSnoozeReason), now, r.id); err != nil {
		return asUnavailable(ctx, fmt.Errorf("outbox: snooze %s/%s: %w", r.topic, r.key, err))
	}
	return nil
}
