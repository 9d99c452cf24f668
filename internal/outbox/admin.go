package outbox

import (
	"context"
	"fmt"
	"time"
)

// Replay puts a dead task back to pending with its publish attempts, handler
// attempts and snoozes reset,
// and a new generation, so the relay publishes it again and Handle runs it.
// A missing task returns ErrNotFound; a task in any other state is left
// as it is and returns ErrNotDead, naming its state.
func Replay(ctx context.Context, q Querier, topic, key string) error {
	if err := checkCall("Replay", q, topic, key); err != nil {
		return err
	}
	now := time.Now().UnixMilli()
	res, err := q.ExecContext(ctx, `UPDATE delay_task SET state = 'pending', generation = generation + 1, publish_attempts = 0,
  next_attempt_ms = 0, last_error = NULL, published_ms = 0, updated_ms = ?, lease_owner = 0, rescues = 0, attempts = 0, snoozes = 0
WHERE topic = ? AND task_key = ? AND state = 'dead'`, now, topic, []byte(key))
	if err != nil {
		return fmt.Errorf("outbox: replay %s/%s: %w", topic, key, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	st, err := newWriter(config{}).state(ctx, q, topic, key)
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: replay %s/%s: task is %s", ErrNotDead, topic, key, st)
}
