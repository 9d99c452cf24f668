package ops

import (
	"context"
	"fmt"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/store"
)

// ListDead returns up to limit dead tasks, oldest due first.
func ListDead(ctx context.Context, q outbox.Querier, limit int) ([]*outbox.TaskInfo, error) {
	if err := store.CheckQuerier("ListDead", q); err != nil {
		return nil, err
	}
	rows, err := q.QueryContext(ctx, store.SelectTask+" WHERE state = 'dead' ORDER BY due_ms LIMIT ?", limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead: %w", err)
	}
	defer rows.Close()
	var out []*outbox.TaskInfo
	for rows.Next() {
		i, err := scanInfo(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, i)
	}
	return out, rows.Err()
}
