package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/outbox"
)

// dbWith opens a second pool on b's database whose every connection sets
// the session variables params on connect (the driver sends unknown DSN
// parameters as SET statements), and closes it at cleanup.
func (b *bundle) dbWith(t *testing.T, params map[string]string) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = params
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// clockBehind returns a pool whose database clock runs an hour behind this
// host's: the session's timestamp, which UTC_TIMESTAMP(6) reads, is set an
// hour back on each connection. It fails the test unless the database
// really reports that clock, or the tests using it would prove nothing.
func (b *bundle) clockBehind(t *testing.T) *sql.DB {
	t.Helper()
	db := b.dbWith(t, map[string]string{"timestamp": "UNIX_TIMESTAMP(NOW(6)) - 3600"})
	var dbNow int64
	if err := db.QueryRowContext(b.ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000").Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	if lag := time.Since(time.UnixMilli(dbNow)); lag < 59*time.Minute || lag > 61*time.Minute {
		t.Fatalf("precondition: UTC_TIMESTAMP(6) is %v behind this host with the session timestamp an hour back, want about an hour", lag)
	}
	return db
}

// eightHoursEast returns a pool whose sessions are in time zone +08:00, so
// NOW(6) reads eight hours ahead of UTC_TIMESTAMP(6) whatever zone the
// server runs in. It fails the test unless the database says so.
func (b *bundle) eightHoursEast(t *testing.T) *sql.DB {
	t.Helper()
	db := b.dbWith(t, map[string]string{"time_zone": "'+08:00'"})
	var ahead int64
	if err := db.QueryRowContext(b.ctx, "SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(6), NOW(6))").Scan(&ahead); err != nil {
		t.Fatal(err)
	}
	if ahead < 8*3600-1 || ahead > 8*3600+1 {
		t.Fatalf("precondition: NOW(6) is %ds ahead of UTC_TIMESTAMP(6) in time zone +08:00, want 28800", ahead)
	}
	return db
}

// wantEarly fails the test unless err is a *broker.EarlyError with about
// an hour remaining.
func wantEarly(t *testing.T, what string, err error) {
	t.Helper()
	var early *broker.EarlyError
	if !errors.As(err, &early) {
		t.Fatalf("%s = %v; want a *broker.EarlyError", what, err)
	}
	if early.Remaining < 59*time.Minute || early.Remaining > 61*time.Minute {
		t.Fatalf("%s: %v remaining; want about an hour, by the database's clock", what, early.Remaining)
	}
}

// wantUntouched fails the test unless the task of msg and its order are
// as they were before (info) and the handler never ran.
func (b *bundle) wantUntouched(t *testing.T, msg *broker.Message, before *outbox.TaskInfo) {
	t.Helper()
	if after, err := outbox.Get(b.ctx, b.db, msg.Topic, msg.Key); err != nil || !reflect.DeepEqual(after, before) {
		t.Fatalf("task after = %+v, %v; want as it was, %+v", after, err, before)
	}
	if status, cancels := b.orderRow(t, msg.Key); status != "UNPAID" || cancels != 0 {
		t.Fatalf("order %s with %d cancels; want untouched", status, cancels)
	}
}

// byIDAndByKey returns msg and a copy without its task id: the task row is
// looked up, and the database's clock read, by a statement of each kind.
func byIDAndByKey(msg *broker.Message) map[string]*broker.Message {
	byKey := *msg
	byKey.TaskID = 0
	return map[string]*broker.Message{"by id": msg, "by key": &byKey}
}

// handleEarly runs msg, found by id and by key, through Handle on db and
// wants it early by about an hour, with fn never run and nothing changed.
func (b *bundle) handleEarly(t *testing.T, db *sql.DB, msg *broker.Message) {
	t.Helper()
	before, err := outbox.Get(b.ctx, b.db, msg.Topic, msg.Key)
	if err != nil {
		t.Fatal(err)
	}
	for how, m := range byIDAndByKey(msg) {
		o, err := outbox.Handle(b.ctx, db, m, func(context.Context, *sql.Tx) error {
			t.Errorf("%s: fn ran for a task the database's clock says is not due", how)
			return nil
		})
		wantEarly(t, "Handle "+how, err)
		if o != outbox.Handled {
			// Handle's zero outcome goes with an error; anything else is a skip.
			t.Fatalf("Handle %s: outcome %v beside the early error", how, o)
		}
		b.wantUntouched(t, msg, before)
	}
}

// handleGroupEarly is handleEarly through HandleGroup: the message is
// reported early in its errs entry and the group itself does not fail.
func (b *bundle) handleGroupEarly(t *testing.T, db *sql.DB, msg *broker.Message) {
	t.Helper()
	before, err := outbox.Get(b.ctx, b.db, msg.Topic, msg.Key)
	if err != nil {
		t.Fatal(err)
	}
	for how, m := range byIDAndByKey(msg) {
		_, errs, err := outbox.HandleGroup(b.ctx, db, []*broker.Message{m}, func(context.Context, *sql.Tx, *broker.Message) error {
			t.Errorf("%s: fn ran for a task the database's clock says is not due", how)
			return nil
		})
		if err != nil {
			t.Fatalf("HandleGroup %s: %v", how, err)
		}
		wantEarly(t, "HandleGroup "+how+": errs[0]", errs[0])
		b.wantUntouched(t, msg, before)
	}
}

// A task due a second ago by this host's clock is not due while the
// database's clock, the one every consumer host shares, is an hour behind:
// a consumer whose clock runs ahead must not run tasks early.
func TestHandle_ATaskDueByTheHostClockWaitsForTheDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now().Add(-time.Second))
	b.handleEarly(t, b.clockBehind(t), msg)
}

func TestHandleGroup_ATaskDueByTheHostClockWaitsForTheDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now().Add(-time.Second))
	b.handleGroupEarly(t, b.clockBehind(t), msg)
}

// Due times are UTC epoch milliseconds, so the database's clock is read in
// UTC: a session in another time zone (NOW(6) eight hours ahead) does not
// make a task due in an hour due now.
func TestHandle_TheSessionTimeZoneDoesNotMakeATaskDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now().Add(time.Hour))
	msg.DeliverAt = broker.MillisUTC(time.Now()) // the message claims it is due
	b.handleEarly(t, b.eightHoursEast(t), msg)
}

func TestHandleGroup_TheSessionTimeZoneDoesNotMakeATaskDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now().Add(time.Hour))
	msg.DeliverAt = broker.MillisUTC(time.Now()) // the message claims it is due
	b.handleGroupEarly(t, b.eightHoursEast(t), msg)
}
