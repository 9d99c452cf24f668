package console

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"database/sql"
	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/driver"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// doctorRanCheck is what the doctor of testEnv reports: the console's
// tests check the brokers page runs doctor and shows its checks; the
// binary's tests check the checks themselves.
const doctorRanCheck = "doctor's checks ran (test double)"

// testEnv is the Env of a console test: the broker settings of brokerArgs,
// parsed as the binary's broker flags, logging into logs. Its doctor
// reports doctorRanCheck.
func testEnv(t testing.TB, dsn string, logs io.Writer, brokerArgs ...string) Env {
	t.Helper()
	log := slog.New(slog.NewTextHandler(logs, nil))
	flat, err := driver.ParseArgs(brokerArgs...)
	if err != nil {
		t.Fatal(err)
	}
	return Env{
		Log:    log,
		Stdout: io.Discard,
		Broker: *flat,
		DSN:    dsn,
		CheckBroker: func() error {
			a, err := flat.Adapter(log)
			if err != nil {
				return err
			}
			return delaybridge.Config{Broker: a}.Check()
		},
		OpenShards: func(context.Context) ([]*Shard, error) { return nil, nil },
		Doctor: func(context.Context, time.Duration) DoctorReport {
			return DoctorReport{Checks: []Check{{Level: "OK", Text: doctorRanCheck}}}
		},
	}
}

// scratch returns a pool on a fresh migrated database and its DSN.
func scratch(t testing.TB) (*sql.DB, string) {
	t.Helper()
	db, dsn := testenv.ScratchDB(t)
	if _, err := outbox.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db, dsn
}
