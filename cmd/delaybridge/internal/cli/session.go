package cli

import (
	"context"
	"database/sql"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// Clients are an opened adapter's publisher and subscriber.
type Clients struct {
	Pub   broker.Publisher
	Sub   broker.Subscriber
	Close func()
	// Addr is the broker address readiness checks dial.
	Addr string
	// Ensure creates topics that must exist before a consumer starts; a
	// no-op where the adapter declares them itself.
	Ensure func(ctx context.Context, topics ...string) error
}

// Session is what run, demo and bench open before their work: the outbox
// database and the broker's clients.
type Session struct {
	DB      *sql.DB
	Clients *Clients
}

// Close disconnects the broker, then closes the database.
func (s *Session) Close() {
	s.Clients.Close()
	s.DB.Close()
}
