package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/delaybridge/delaybridge/internal/store"
)

// Overdue reports whether the task of (topic, key) is due by the
// database's clock and not finished: pending, published, or dead (its
// handler gave up). It is the lazy check of the read path: between the due
// time and the moment the consumer runs the handler (normally
// milliseconds, longer while a broker or consumer is down), the business
// row still looks as if nothing were due, so a read that must not show,
// say, a stale UNPAID order asks Overdue and shows the order as expired.
// A task that is done or cancelled, and a key with no task, are not
// overdue. The database's clock is the one Handle uses, so Overdue turns
// true no earlier than the handler may run.
func Overdue(ctx context.Context, q Querier, topic, key string) (bool, error) {
	if err := checkCall("Overdue", q, topic, key); err != nil {
		return false, err
	}
	var overdue bool
	err := q.QueryRowContext(ctx, "SELECT due_ms <= "+store.DBNowMS+" FROM delay_task WHERE topic = ? AND task_key = ? AND state IN ('pending', 'published', 'dead')",
		topic, []byte(key)).Scan(&overdue)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("outbox: overdue %s/%s: %w", topic, key, err)
	}
	return overdue, nil
}
