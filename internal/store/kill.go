package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// killTimeout bounds the KILL QUERY that ends a cancelled statement.
const killTimeout = 5 * time.Second

// OnConn runs f on a connection of db's own and ends f's statement on the
// server when ctx ends first. The driver only closes its socket on
// cancellation, and a server goes on with a statement that sends nothing
// until it is done: a count of millions of rows, left by a daemon that
// stopped, would keep a core busy for minutes. OnConn sends KILL QUERY
// for that connection from another one (a user may kill its own
// statements), and returns when that is done, so the connection never
// goes back to the pool with a kill still to come.
func OnConn(ctx context.Context, db *sql.DB, f func(q Querier) error) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("outbox: take a connection: %w", err)
	}
	defer conn.Close()
	var id int64
	if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		return fmt.Errorf("outbox: read the connection's id: %w", err)
	}
	killed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(killed)
		kctx, cancel := context.WithTimeout(context.Background(), killTimeout)
		defer cancel()
		_, _ = db.ExecContext(kctx, fmt.Sprintf("KILL QUERY %d", id))
	})
	err = f(conn)
	if !stop() {
		<-killed
	}
	return err
}
