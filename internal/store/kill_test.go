package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/store"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// A statement OnConn runs ends on the server when its context ends, not
// only in the client: a long count left behind would burn a core for
// minutes. The statement here (a count over 100 billion generated rows)
// sends nothing until done, so the server would never notice the closed
// socket by itself.
func TestOnConn_ACancelledStatementEndsOnTheServer(t *testing.T) {
	db, _ := testenv.ScratchDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	var id int64
	started := make(chan struct{})
	go func() {
		<-started
		time.Sleep(300 * time.Millisecond)
		cancel()
	}()
	err := store.OnConn(ctx, db, func(q store.Querier) error {
		if err := q.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
			return err
		}
		close(started)
		var n int64
		return q.QueryRowContext(ctx, "SELECT COUNT(*) FROM seq_1_to_100000000000 WHERE seq % 7 = 3").Scan(&n)
	})
	if err == nil {
		t.Fatal("the count finished: want it cancelled")
	}
	// Whatever happens, the server does not keep counting after the test.
	t.Cleanup(func() { _, _ = db.Exec(fmt.Sprintf("KILL QUERY %d", id)) })
	running := func() bool {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO LIKE 'SELECT COUNT(*) FROM seq_%'", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	for deadline := time.Now().Add(5 * time.Second); running(); {
		if time.Now().After(deadline) {
			t.Fatalf("connection %d still runs the count 5 s after its context ended (err %v)", id, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
