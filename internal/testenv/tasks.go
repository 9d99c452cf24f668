package testenv

import (
	"database/sql"
	"fmt"
	"testing"
)

// TaskRows describes the delay_task rows FillTasks inserts.
type TaskRows struct {
	Topic, State string
	// N rows, keyed KeyPrefix1 … KeyPrefixN.
	N         int
	KeyPrefix string
	// DueMS + i is row i's due time, and every row's created and updated time.
	DueMS   int64
	Payload []byte
}

// FillTasks bulk-inserts r straight into delay_task, 100,000 rows per
// statement through MariaDB's sequence engine: benchmarks start from a full
// table in seconds rather than minutes of Schedule calls.
func FillTasks(tb testing.TB, db *sql.DB, r TaskRows) {
	tb.Helper()
	payload := r.Payload
	if payload == nil {
		payload = []byte{}
	}
	for done := 0; done < r.N; done += 100_000 {
		k := min(100_000, r.N-done)
		_, err := db.Exec(fmt.Sprintf(`INSERT INTO delay_task (topic, task_key, due_ms, payload, state, created_ms, updated_ms)
SELECT ?, CONCAT(?, seq), ? + seq, ?, ?, ?, ? FROM seq_%d_to_%d`, done+1, done+k), r.Topic, r.KeyPrefix, r.DueMS, payload, r.State, r.DueMS, r.DueMS)
		if err != nil {
			tb.Fatalf("fill delay_task: %v", err)
		}
	}
}
