package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/delaybridge/delaybridge/broker"
)

// Claimed is one task row a claim locked, as the message to publish for it.
type Claimed struct {
	Message *broker.Message
	// PublishAttempts is the row's publish_attempts before this claim.
	PublishAttempts int
	// HeadersErr is set when the row's headers could not be read or no
	// broker would carry them (a hand-edited row); the message then
	// carries none rather than block or be refused.
	HeadersErr error
}

// BeginClaim starts the transaction a claim runs in. READ COMMITTED: the
// claim locks only the rows it returns, no gaps of the (state, due_ms)
// index, so producers inserting new tasks never wait on (or deadlock with)
// a claim.
func BeginClaim(ctx context.Context, db *sql.DB) (*sql.Tx, error) {
	return db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
}

// Claim locks up to limit rows in state whose due_ms is at most dueAtMost
// and whose next_attempt_ms is at most nowMS, oldest due first, skipping
// rows another transaction holds, and returns them as messages. The locks
// last until tx ends. It is the one query the relay (state pending) and the
// scanner (state published, overdue) share: a range of the (state, due_ms)
// index.
func Claim(ctx context.Context, tx *sql.Tx, state State, dueAtMost, nowMS int64, limit int) ([]Claimed, error) {
	rows, err := tx.QueryContext(ctx, `SELECT id, topic, task_key, due_ms, payload, headers, trace, generation, publish_attempts
FROM delay_task FORCE INDEX (ix_delay_task_state_due)
WHERE state = ? AND due_ms <= ? AND next_attempt_ms <= ?
ORDER BY due_ms LIMIT ? FOR UPDATE SKIP LOCKED`, string(state), dueAtMost, nowMS, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim %s: %w", state, err)
	}
	defer rows.Close()
	var out []Claimed
	for rows.Next() {
		var (
			c              Claimed
			m              broker.Message
			key            []byte
			dueMS          int64
			headers, trace sql.NullString
		)
		if err := rows.Scan(&m.TaskID, &m.Topic, &key, &dueMS, &m.Payload, &headers, &trace, &m.Generation, &c.PublishAttempts); err != nil {
			return nil, fmt.Errorf("outbox: read claim: %w", err)
		}
		m.Key, m.DeliverAt, m.Trace = string(key), msTime(dueMS), trace.String
		if headers.Valid {
			m.Headers, c.HeadersErr = decodeHeaders(headers.String)
		}
		c.Message = &m
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: claim %s: %w", state, err)
	}
	return out, nil
}

// decodeHeaders reads the headers column as Schedule wrote it. Rows are
// edited by hand now and then, so it checks what it returns as
// Message.Validate would, and never panics.
func decodeHeaders(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, fmt.Errorf("headers column: %w", err)
	}
	m := broker.Message{Topic: "t", Key: "k", DeliverAt: time.Now(), Headers: h}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("headers column: %w", err)
	}
	if len(h) == 0 {
		h = nil
	}
	return h, nil
}
