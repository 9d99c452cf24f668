package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Handle and HandleGroup mark what the database did to them (unreachable)
// with broker.ErrUnavailable, so the runtime spends no attempt on it; an
// error of the handler's own making, or from a service of its own, stays
// the task's.
func TestHandle_TellsAnUnavailableDatabaseFromTheTasksOwnFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := b.order(t, "o-1", time.Now().Add(-time.Millisecond))
	db, proxy := testenv.ProxiedDB(t, b.dsn)

	own := errors.New("the payment service said no")
	if _, err := outbox.Handle(b.ctx, db, m, func(context.Context, *sql.Tx) error { return own }); !errors.Is(err, own) || errors.Is(err, broker.ErrUnavailable) {
		t.Fatalf("handler's own error came back as %v; want it, not ErrUnavailable", err)
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	if _, err := outbox.Handle(b.ctx, db, m, func(context.Context, *sql.Tx) error { return refused }); errors.Is(err, broker.ErrUnavailable) {
		t.Fatalf("a refused call of the handler's own came back as %v; it is the task's attempt, not the database's outage", err)
	}

	proxy.Cut()
	ran := false
	if _, err := outbox.Handle(b.ctx, db, m, func(context.Context, *sql.Tx) error { ran = true; return nil }); !errors.Is(err, broker.ErrUnavailable) {
		t.Fatalf("Handle with the database cut off = %v; want broker.ErrUnavailable", err)
	}
	if _, _, err := outbox.HandleGroup(b.ctx, db, []*broker.Message{m}, cancelOne); !errors.Is(err, broker.ErrUnavailable) {
		t.Fatalf("HandleGroup with the database cut off = %v; want broker.ErrUnavailable", err)
	}
	if ran {
		t.Fatal("the handler ran with the database cut off")
	}
	proxy.Restore()
	if o, err := outbox.Handle(b.ctx, db, m, cancelOrder("o-1")); err != nil || o != outbox.Handled {
		t.Fatalf("Handle once the database is back = %v, %v", o, err)
	}
}
