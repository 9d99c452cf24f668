package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// cancelOrder is the order-timeout handler: cancel the order if still unpaid.
func cancelOrder(id string) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'CANCELLED', cancels = cancels + 1 WHERE id = ? AND status = 'UNPAID'", id)
		return err
	}
}

func (b *bundle) order(t *testing.T, id string, due time.Time) *broker.Message {
	t.Helper()
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(b.ctx, "INSERT INTO orders (id, status) VALUES (?, 'UNPAID')", id); err != nil {
		t.Fatal(err)
	}
	taskID, err := outbox.Schedule(b.ctx, tx, outbox.Task{Topic: "order-cancel", Key: id, DueAt: due})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// As the relay sends it: the due time the table holds.
	return &broker.Message{TaskID: taskID, Topic: "order-cancel", Key: id, DeliverAt: time.UnixMilli(broker.DueMillis(due)).UTC()}
}

func (b *bundle) orderRow(t *testing.T, id string) (status string, cancels int) {
	t.Helper()
	if err := b.db.QueryRow("SELECT status, cancels FROM orders WHERE id = ?", id).Scan(&status, &cancels); err != nil {
		t.Fatal(err)
	}
	return status, cancels
}

// handleConcurrently delivers msg n times at once through Handle, fn
// counting an order's cancels, and fails unless exactly one delivery ran
// fn and every other found the task done, and the effect was applied once.
func (b *bundle) handleConcurrently(t *testing.T, msg *broker.Message, n int, fn func(context.Context, *sql.Tx) error) {
	t.Helper()
	var wg sync.WaitGroup
	outcomes := make([]outbox.HandleResult, n)
	for i := range outcomes {
		wg.Go(func() {
			o, err := outbox.Handle(b.ctx, b.db, msg, fn)
			if err != nil {
				t.Error(err)
			}
			outcomes[i] = o
		})
	}
	wg.Wait()
	handled := 0
	for _, o := range outcomes {
		if o == outbox.Handled {
			handled++
		} else if o != outbox.SkippedDone {
			t.Errorf("outcome %v, want handled or skipped: done", o)
		}
	}
	if _, cancels := b.orderRow(t, msg.Key); handled != 1 || cancels != 1 {
		t.Fatalf("%d handled, effect applied %d times; want 1 and 1", handled, cancels)
	}
}

func TestHandle_DuplicateDeliveriesHaveOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now().Add(-time.Millisecond))
	// Increment unconditionally, after a pause that makes the duplicates
	// overlap for certain: only the task row's lock, taken by id, keeps
	// this to one.
	b.handleConcurrently(t, msg, 8, func(ctx context.Context, tx *sql.Tx) error { return slowIncrement(ctx, tx, "o1") })
	info, _ := outbox.Get(b.ctx, b.db, "order-cancel", "o1")
	if info.State != outbox.StateDone || info.DoneAt.IsZero() {
		t.Fatalf("task %+v, want done", info)
	}
}

func TestHandle_SkipsCancelledDeadStaleAndMissing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	never := func(ctx context.Context, tx *sql.Tx) error { t.Error("fn ran"); return nil }

	cancelled := b.order(t, "cancelled", time.Now().Add(-time.Millisecond))
	if err := outbox.Cancel(b.ctx, b.db, "order-cancel", "cancelled"); err != nil {
		t.Fatal(err)
	}
	// A message the runtime gave up on, marked dead, then delivered again
	// (a redelivery, or a copy the scanner rescued before it died).
	dead := b.order(t, "dead", time.Now().Add(-time.Millisecond))
	if err := outbox.DeadLetter(b.db, nil).Dead(b.ctx, &broker.Delivery{Message: dead}, errors.New("failed 10 attempts")); err != nil {
		t.Fatal(err)
	}
	stale := b.order(t, "stale", time.Now().Add(-time.Millisecond))
	if err := outbox.Reschedule(b.ctx, b.db, "order-cancel", "stale", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	missing := &broker.Message{TaskID: 999999, Topic: "order-cancel", Key: "nope", DeliverAt: time.Now()}
	for _, tc := range []struct {
		msg  *broker.Message
		want outbox.HandleResult
	}{{cancelled, outbox.SkippedCancelled}, {dead, outbox.SkippedDead}, {stale, outbox.SkippedStale}, {missing, outbox.SkippedMissing}} {
		if got, err := outbox.Handle(b.ctx, b.db, tc.msg, never); err != nil || got != tc.want {
			t.Errorf("%s: Handle = %v, %v; want %v", tc.msg.Key, got, err, tc.want)
		}
	}
	if info, err := outbox.Get(b.ctx, b.db, "order-cancel", "dead"); err != nil {
		t.Error(err)
	} else if info.State != outbox.StateDead {
		t.Errorf("the dead task is %s after Handle; want still dead, for Replay", info.State)
	}
	// The rescheduled task's new generation does not run before its new
	// due time, whatever its message says, and runs once that has come.
	fresh := *stale
	fresh.Generation = 1
	var early *broker.EarlyError
	if got, err := outbox.Handle(b.ctx, b.db, &fresh, cancelOrder("stale")); !errors.As(err, &early) || early.Remaining < 59*time.Minute {
		t.Fatalf("new generation due in 1h: Handle = %v, %v; want an EarlyError of about an hour", got, err)
	}
	if err := outbox.Reschedule(b.ctx, b.db, "order-cancel", "stale", time.Now()); err != nil {
		t.Fatal(err)
	}
	fresh.Generation = 2
	if got, err := outbox.Handle(b.ctx, b.db, &fresh, cancelOrder("stale")); err != nil || got != outbox.Handled {
		t.Fatalf("new generation: Handle = %v, %v", got, err)
	}
}

func TestHandle_FailureCommitsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now().Add(-time.Millisecond))
	boom := errors.New("payment service down")
	_, err := outbox.Handle(b.ctx, b.db, msg, func(ctx context.Context, tx *sql.Tx) error {
		if err := cancelOrder("o1")(ctx, tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Handle = %v, want the handler's error", err)
	}
	if status, _ := b.orderRow(t, "o1"); status != "UNPAID" {
		t.Fatalf("order is %s after a failed handler, want UNPAID", status)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", "o1"); info.State != outbox.StatePending {
		t.Fatalf("task is %s, want still pending", info.State)
	}
}

// pay is the order service's payment: cancel the timeout task first (task
// row, then order row: the lock order Handle uses), then mark the order paid
// if it still is unpaid. It reports whether the payment went through.
func pay(ctx context.Context, db *sql.DB, id string) (bool, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck
	if err := outbox.Cancel(ctx, tx, "order-cancel", id); errors.Is(err, outbox.ErrFinished) {
		return false, nil // the timeout won
	} else if err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'PAID' WHERE id = ? AND status = 'UNPAID'", id)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return false, nil
	}
	return true, tx.Commit()
}

func TestPayRace_NeverCancelsAPaidOrderNorLeavesAnUnpaidOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rounds = 200
	paidWins, cancelWins := 0, 0
	for i := range rounds {
		id := fmt.Sprintf("race-%d", i)
		msg := b.order(t, id, time.Now().Add(-time.Millisecond))
		var wg sync.WaitGroup
		var paid bool
		var outcome outbox.HandleResult
		var payErr, handleErr error
		wg.Add(2)
		go func() { defer wg.Done(); paid, payErr = pay(b.ctx, b.db, id) }()
		go func() {
			defer wg.Done()
			outcome, handleErr = outbox.Handle(b.ctx, b.db, msg, cancelOrder(id))
		}()
		wg.Wait()
		if payErr != nil || handleErr != nil {
			t.Fatalf("round %d: pay %v, handle %v", i, payErr, handleErr)
		}
		// The handler's "if unpaid" keeps a paid order paid on its own;
		// Handle's outcome and the task's state show whether Handle let a
		// cancelled task run.
		status, cancels := b.orderRow(t, id)
		info, err := outbox.Get(b.ctx, b.db, "order-cancel", id)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case paid && status == "PAID" && cancels == 0 && outcome == outbox.SkippedCancelled && info.State == outbox.StateCancelled:
			paidWins++
		case !paid && status == "CANCELLED" && cancels == 1 && outcome == outbox.Handled && info.State == outbox.StateDone:
			cancelWins++
		default:
			t.Fatalf("round %d: paid=%v but order is %s with %d cancels, Handle %v, task %s", i, paid, status, cancels, outcome, info.State)
		}
	}
	t.Logf("payment won %d rounds, timeout won %d", paidWins, cancelWins)
	if paidWins == 0 {
		t.Fatal("the payment never won: Handle's cancelled check went untested")
	}
}

func TestEndToEnd_RelayConsumerHandleOverMemoryBroker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{Limits: broker.Limits{MaxHop: 300 * time.Millisecond}})
	t.Cleanup(func() { _ = mem.Close() })
	const n = 50
	due := time.Now().Add(700 * time.Millisecond)
	for i := range n {
		b.order(t, fmt.Sprintf("e2e-%d", i), due)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	relay := newRelay(t, b, mem, outbox.RelayConfig{IdleMin: 5 * time.Millisecond, IdleMax: 20 * time.Millisecond})
	go func() { _ = relay.Run(ctx) }()
	c, err := broker.NewConsumer(mem, mem, outbox.BrokerHandler(b.db, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		if time.Now().Before(m.DeliverAt) {
			t.Errorf("%s handled early", m.Key)
		}
		return cancelOrder(m.Key)(ctx, tx)
	}), broker.ConsumerConfig{Logger: quiet(), HoldWindow: 100 * time.Millisecond, DeadLetter: outbox.DeadLetter(b.db, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, "order-cancel"); err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background()) //nolint:errcheck
	if !testutil.Eventually(20*time.Second, 20*time.Millisecond, func() bool { return b.count(t, "state = 'done'") >= n }) {
		t.Fatalf("only %d of %d tasks done", b.count(t, "state = 'done'"), n)
	}
	var cancelled int
	if err := b.db.QueryRow("SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED' AND cancels = 1").Scan(&cancelled); err != nil || cancelled != n {
		t.Fatalf("%d orders cancelled once, want %d (%v)", cancelled, n, err)
	}
}

func TestDeadLetter_MarksTheTaskDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now().Add(-time.Millisecond))
	dl := outbox.DeadLetter(b.db, nil)
	if err := dl.Dead(b.ctx, &broker.Delivery{Message: msg}, errors.New("failed 10 attempts")); err != nil {
		t.Fatal(err)
	}
	info, _ := outbox.Get(b.ctx, b.db, "order-cancel", "o1")
	if info.State != outbox.StateDead || info.LastError != "dead: failed 10 attempts" {
		t.Fatalf("task %+v, want dead with the reason", info)
	}
}

// A late copy of an old message never kills the new task of its key.
func TestDeadLetter_NamesTheTaskByIDAndChecksItAgainstTheRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := b.order(t, "reused", time.Now().Add(-time.Millisecond))
	if _, err := outbox.Handle(b.ctx, b.db, old, cancelOrder("reused")); err != nil {
		t.Fatal(err)
	}
	// The cleaner deleted the done task, and the key was scheduled again.
	if _, err := b.db.Exec("DELETE FROM delay_task WHERE id = ?", old.TaskID); err != nil {
		t.Fatal(err)
	}
	fresh := b.schedule(t, outbox.Task{Topic: "order-cancel", Key: "reused", DueAt: time.Now()})
	dl := outbox.DeadLetter(b.db, nil)
	if err := dl.Dead(b.ctx, &broker.Delivery{Message: old}, errors.New("failed 10 attempts")); err != nil {
		t.Fatal(err)
	}
	// Reasons that are about the delivery, not the task, never mark a row,
	// even one the message names exactly.
	same := &broker.Message{TaskID: fresh, Topic: "order-cancel", Key: "reused", DeliverAt: time.Now()}
	for _, reason := range []error{broker.ErrTooFar, broker.ErrWrongTopic, broker.ErrForged, &broker.EnvelopeError{Header: "x", Reason: "y"}} {
		if err := dl.Dead(b.ctx, &broker.Delivery{Message: same}, reason); err != nil {
			t.Fatal(err)
		}
	}
	if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", "reused"); info.State != outbox.StatePending {
		t.Fatalf("the new task is %s after dead letters meant for others, want pending", info.State)
	}
	if err := dl.Dead(b.ctx, &broker.Delivery{Message: same}, errors.New("failed 10 attempts")); err != nil {
		t.Fatal(err)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", "reused"); info.State != outbox.StateDead {
		t.Fatalf("the task is %s after its own handler gave up, want dead", info.State)
	}
}

// Handle, HandleGroup and the cleaner refuse nil parts instead of
// panicking (after a transaction began, for some of them).
func TestHandleAndCleaner_RefuseNilParts(t *testing.T) {
	ctx := context.Background()
	msg := &broker.Message{Topic: "t", Key: "k", DeliverAt: time.Now()}
	fn := func(context.Context, *sql.Tx) error { return nil }
	db, err := sql.Open("mysql", "u:p@tcp(127.0.0.1:1)/x")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := outbox.Handle(ctx, nil, msg, fn); !errors.Is(err, outbox.ErrNoQuerier) {
		t.Errorf("Handle with a nil db: %v", err)
	}
	if _, err := outbox.Handle(ctx, db, nil, fn); err == nil {
		t.Error("Handle with a nil message succeeded")
	}
	if _, err := outbox.Handle(ctx, db, msg, nil); err == nil {
		t.Error("Handle with a nil function succeeded")
	}
	gfn := func(context.Context, *sql.Tx, *broker.Message) error { return nil }
	if _, _, err := outbox.HandleGroup(ctx, nil, []*broker.Message{msg}, gfn); !errors.Is(err, outbox.ErrNoQuerier) {
		t.Errorf("HandleGroup with a nil db: %v", err)
	}
	if _, _, err := outbox.HandleGroup(ctx, db, []*broker.Message{msg}, nil); err == nil {
		t.Error("HandleGroup with a nil function succeeded")
	}
	if _, _, err := outbox.HandleGroup(ctx, db, []*broker.Message{msg, nil}, gfn); err == nil {
		t.Error("HandleGroup with a nil message succeeded")
	}
	if _, err := outbox.NewCleaner(nil, outbox.CleanerConfig{}).Once(ctx); !errors.Is(err, outbox.ErrNoQuerier) {
		t.Errorf("a cleaner without a database: %v", err)
	}
}

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

// A task due a second ago by this host's clock is not due while the
// database's clock, the one every consumer host shares, is an hour behind:
// a consumer whose clock runs ahead must not run tasks early.
func TestHandle_ATaskDueByTheHostClockWaitsForTheDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now().Add(-time.Second))
	b.handleEarly(t, b.clockBehind(t), msg)
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

// refuseDone makes the database refuse every update of a task to done (a
// lost connection or a full disk, in life): a trigger fails the statement,
// and only the statement, so the transaction around it stays open and
// would commit whatever came before it.
func (b *bundle) refuseDone(t *testing.T) {
	t.Helper()
	if _, err := b.db.ExecContext(b.ctx, `CREATE TRIGGER refuse_done BEFORE UPDATE ON delay_task FOR EACH ROW
BEGIN IF NEW.state = 'done' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF; END`); err != nil {
		t.Fatal(err)
	}
}

// wantNoEffectNotDone fails the test unless none of keys' orders counts a
// cancel and each of their tasks is still pending.
func (b *bundle) wantNoEffectNotDone(t *testing.T, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, cancels := b.orderRow(t, k); cancels != 0 {
			t.Errorf("%s: the effect was committed %d times though its task could not be marked done", k, cancels)
		}
		if info, err := outbox.Get(b.ctx, b.db, "order-cancel", k); err != nil || info.State != outbox.StatePending {
			t.Errorf("%s: task %+v, %v; want still pending", k, info, err)
		}
	}
}

// countCancel counts a run in the order's cancels, unconditionally:
// committed without its task's done mark, it would be counted again by
// every redelivery.
func countCancel(ctx context.Context, tx *sql.Tx, key string) error {
	_, err := tx.ExecContext(ctx, "UPDATE orders SET cancels = cancels + 1 WHERE id = ?", key)
	return err
}

// An effect is committed only with its task marked done: when the mark
// fails, Handle fails and commits nothing, so the redelivery runs fn again
// on a clean slate instead of applying the effect a second time.
func TestHandle_AFailedDoneMarkCommitsNoEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "o1", time.Now().Add(-time.Millisecond))
	b.refuseDone(t)
	if _, err := outbox.Handle(b.ctx, b.db, msg, func(ctx context.Context, tx *sql.Tx) error { return countCancel(ctx, tx, "o1") }); err == nil {
		t.Error("Handle reported no error though the task could not be marked done")
	}
	b.wantNoEffectNotDone(t, "o1")
}

// ledger is the part of a task row the consumer's guards protect.
type ledger struct {
	state       string
	gen         int64
	attempts    int
	nextAttempt int64
	lastError   string
}

func (b *bundle) ledger(t *testing.T, id int64) ledger {
	t.Helper()
	var (
		l       ledger
		lastErr sql.NullString
	)
	if err := b.db.QueryRowContext(b.ctx, "SELECT state, generation, attempts, next_attempt_ms, last_error FROM delay_task WHERE id = ?", id).
		Scan(&l.state, &l.gen, &l.attempts, &l.nextAttempt, &lastErr); err != nil {
		t.Fatal(err)
	}
	l.lastError = lastErr.String
	return l
}

// mismatched returns messages that carry the id of task but are not its
// messages: another key, and another topic.
func mismatched(task *broker.Message, otherKey string) []*broker.Message {
	wrongKey, wrongTopic := *task, *task
	wrongKey.Key = otherKey
	wrongTopic.Topic = "invoice-expire"
	return []*broker.Message{&wrongKey, &wrongTopic}
}

// A message whose TaskID names a row of another key or topic (an id the
// cleaner freed and a new task took) is not that row's message: Handle
// reports it missing and neither runs fn nor touches the row.
func TestHandle_ATaskIDOfAnotherKeyOrTopicIsMissing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.order(t, "mine", time.Now().Add(-time.Millisecond))
	theirs := b.order(t, "theirs", time.Now().Add(-time.Millisecond))
	for _, m := range mismatched(theirs, "mine") {
		o, err := outbox.Handle(b.ctx, b.db, m, func(ctx context.Context, tx *sql.Tx) error {
			t.Errorf("%s/%s: fn ran for task %d", m.Topic, m.Key, m.TaskID)
			return cancelOrder(m.Key)(ctx, tx)
		})
		if err != nil || o != outbox.SkippedMissing {
			t.Errorf("%s/%s with task %d: Handle = %v, %v; want skipped: missing", m.Topic, m.Key, m.TaskID, o, err)
		}
	}
	for _, id := range []string{"mine", "theirs"} {
		if info, _ := outbox.Get(b.ctx, b.db, "order-cancel", id); info.State != outbox.StatePending {
			t.Errorf("%s task is %s, want untouched", id, info.State)
		}
		if status, _ := b.orderRow(t, id); status != "UNPAID" {
			t.Errorf("%s order is %s, want untouched", id, status)
		}
	}
}

// slowIncrement counts every run in the order's cancels, unconditionally,
// after a pause that lets concurrent handlers of the same task overlap:
// only the task row's lock keeps the count to one.
func slowIncrement(ctx context.Context, tx *sql.Tx, key string) error {
	time.Sleep(50 * time.Millisecond)
	_, err := tx.ExecContext(ctx, "UPDATE orders SET cancels = cancels + 1 WHERE id = ?", key)
	return err
}

// Duplicates of a message without a task id (found by topic and key) run
// once when delivered concurrently: the row lock by key serializes them.
func TestHandle_ConcurrentDuplicatesByKeyHaveOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := b.order(t, "by-key", time.Now().Add(-time.Millisecond))
	msg.TaskID = 0
	b.handleConcurrently(t, msg, 8, func(ctx context.Context, tx *sql.Tx) error { return slowIncrement(ctx, tx, "by-key") })
}

// Dead letters and retry records of an older generation's message, or of
// a message naming the row's id under another key or topic, leave the row
// as it is: a rescheduled task stays pending in its new generation with its
// attempt count.
func TestDeadLetterAndRecordRetry_LeaveANewerGenerationAndOtherTasksAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := b.order(t, "rescheduled", time.Now().Add(-time.Millisecond))
	if err := outbox.Reschedule(b.ctx, b.db, "order-cancel", "rescheduled", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	current := *old
	current.Generation = 1
	current.Attempt = 2
	current.DeliverAt = broker.MillisUTC(time.Now().Add(time.Minute))
	retry := outbox.RecordRetry(b.db)
	if err := retry(b.ctx, &current, errors.New("payment service down")); err != nil {
		t.Fatal(err)
	}
	before := b.ledger(t, old.TaskID)
	// A message of the current generation is in the broker, so its
	// retry makes the row published (see RecordRetry). The row counts
	// the failed run itself, whatever attempt the message claims.
	if before.state != "published" || before.gen != 1 || before.attempts != 1 || before.nextAttempt != current.DeliverAt.UnixMilli() {
		t.Fatalf("after the current generation's retry: %+v; want published, gen 1, one failed run recorded", before)
	}

	stale := *old
	stale.Attempt = 7
	stale.DeliverAt = broker.MillisUTC(time.Now().Add(2 * time.Hour))
	others := append([]*broker.Message{&stale}, mismatched(&current, "someone-else")...)
	dl := outbox.DeadLetter(b.db, nil)
	for _, m := range others {
		m.Attempt = 7
		if err := retry(b.ctx, m, errors.New("late retry")); err != nil {
			t.Fatal(err)
		}
		if got := b.ledger(t, old.TaskID); got != before {
			t.Fatalf("retry of %s/%s gen %d changed the row: %+v, want %+v", m.Topic, m.Key, m.Generation, got, before)
		}
		if err := dl.Dead(b.ctx, &broker.Delivery{Message: m}, errors.New("failed 10 attempts")); err != nil {
			t.Fatal(err)
		}
		if got := b.ledger(t, old.TaskID); got != before {
			t.Fatalf("dead letter of %s/%s gen %d changed the row: %+v, want %+v", m.Topic, m.Key, m.Generation, got, before)
		}
	}
}

// A dead letter or a retry record for a task that is already finished
// (done or cancelled) does not change it: a done task never turns dead.
func TestDeadLetterAndRecordRetry_LeaveFinishedTasksAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := b.order(t, "done", time.Now().Add(-time.Millisecond))
	if o, err := outbox.Handle(b.ctx, b.db, done, cancelOrder("done")); err != nil || o != outbox.Handled {
		t.Fatalf("Handle = %v, %v", o, err)
	}
	cancelled := b.order(t, "cancelled", time.Now().Add(-time.Millisecond))
	if err := outbox.Cancel(b.ctx, b.db, "order-cancel", "cancelled"); err != nil {
		t.Fatal(err)
	}
	dl, retry := outbox.DeadLetter(b.db, nil), outbox.RecordRetry(b.db)
	for _, m := range []*broker.Message{done, cancelled} {
		before := b.ledger(t, m.TaskID)
		late := *m
		late.Attempt = 3
		late.DeliverAt = broker.MillisUTC(time.Now().Add(time.Minute))
		if err := retry(b.ctx, &late, errors.New("late retry")); err != nil {
			t.Fatal(err)
		}
		if err := dl.Dead(b.ctx, &broker.Delivery{Message: &late}, errors.New("failed 10 attempts")); err != nil {
			t.Fatal(err)
		}
		// The keys name the states the tasks are in: "done", "cancelled".
		if got := b.ledger(t, m.TaskID); got != before || got.state != m.Key {
			t.Errorf("%s task: %+v after a late retry and dead letter, want %+v", m.Key, got, before)
		}
	}
}
