package delaybridge_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestOpenDB_KeepsTheConnectionsABusyProcessUses holds as many connections
// at once as a relay and a consumer do under load, gives them back, and
// takes them again: OpenDB's pool must keep them all, where database/sql's
// default (2 idle) closes the rest and dials them anew.
func TestOpenDB_KeepsTheConnectionsABusyProcessUses(t *testing.T) {
	ctx := context.Background()
	db, err := delaybridge.Config{MySQLDSN: testenv.MySQLDSN()}.OpenDB(ctx)
	if err != nil {
		testenv.Unreachable(t, "MariaDB", "DELAYBRIDGE_MYSQL_DSN", err)
	}
	defer db.Close()
	const busy = 19 // 8 claim loops (RocketMQ), the probe, 8 group workers, the scanner, the cleaner, less one
	for round := 0; round < 2; round++ {
		conns := make([]*sql.Conn, busy)
		for i := range conns {
			if conns[i], err = db.Conn(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range conns {
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	st := db.Stats()
	if st.MaxIdleClosed != 0 || st.OpenConnections != busy {
		t.Fatalf("after two rounds of %d connections at once: %d closed as surplus idle, %d open; want 0 closed and %d open (the pool keeps %d idle)",
			busy, st.MaxIdleClosed, st.OpenConnections, busy, delaybridge.DefaultMaxIdleConns)
	}
}
