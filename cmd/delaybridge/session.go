package main

import (
	"context"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// openSession checks the broker flags, opens the database, migrates it
// (demo and bench, on a development database) or checks that it is
// migrated (run, which never changes a deployment's schema), then
// connects the broker, with a subscriber when withSub. What it opened is
// closed again when a later step fails.
func (a *app) openSession(ctx context.Context, bf *brokerFlags, migrate, withSub bool) (*cli.Session, error) {
	if err := bf.check(a); err != nil {
		return nil, err
	}
	db, err := a.openDB(ctx)
	if err != nil {
		return nil, err
	}
	if migrate {
		_, err = outbox.Migrate(ctx, db)
	} else {
		_, err = ops.CheckDatabase(ctx, db)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	cl, err := bf.open(ctx, a, withSub)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &cli.Session{DB: db, Clients: cl}, nil
}
