package outbox_test

import (
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

func TestMigrate_IsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	applied, err := outbox.Migrate(b.ctx, b.db)
	if err != nil || len(applied) != 0 {
		t.Fatalf("second Migrate applied %v, err %v; want nothing", applied, err)
	}
	migs, err := outbox.Migrations()
	if err != nil || len(migs) == 0 {
		t.Fatalf("Migrations() = %v, %v", migs, err)
	}
	var v int
	if err := b.db.QueryRow("SELECT MAX(version) FROM delaybridge_migration").Scan(&v); err != nil || v != migs[len(migs)-1].Version {
		t.Fatalf("recorded version %d (%v), want %d", v, err, migs[len(migs)-1].Version)
	}
}

func TestSchedule_RollbackLeavesNoTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(b.ctx, "INSERT INTO orders (id, status) VALUES ('o1', 'UNPAID')"); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Schedule(b.ctx, tx, outbox.Task{Topic: "order-cancel", Key: "o1", DueAt: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "1=1"); n != 0 {
		t.Fatalf("%d tasks after rollback, want 0", n)
	}
}

func TestSchedule_SameTopicAndKeyIsErrDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task := outbox.Task{Topic: "order-cancel", Key: "o1", DueAt: time.Now().Add(time.Minute), Payload: []byte("a")}
	b.schedule(t, task)
	for _, again := range []outbox.Task{task, {Topic: "order-cancel", Key: "o1", DueAt: time.Now().Add(time.Hour)}} {
		if _, err := outbox.Schedule(b.ctx, b.db, again); !errors.Is(err, outbox.ErrDuplicate) {
			t.Fatalf("second Schedule = %v, want ErrDuplicate", err)
		}
	}
	// The same key under another topic is another task.
	b.schedule(t, outbox.Task{Topic: "order-confirm", Key: "o1", DueAt: time.Now().Add(time.Minute)})
	if n := b.count(t, "1=1"); n != 2 {
		t.Fatalf("%d tasks, want 2", n)
	}
}

func TestSchedule_RejectsBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ok := func() outbox.Task {
		return outbox.Task{Topic: "order-cancel", Key: "o1", DueAt: time.Now().Add(time.Minute)}
	}
	for _, tc := range []struct {
		name string
		edit func(*outbox.Task)
		want error
	}{
		{"empty topic", func(t *outbox.Task) { t.Topic = "" }, broker.ErrInvalidTopic},
		{"topic with a dot", func(t *outbox.Task) { t.Topic = "order.cancel" }, broker.ErrInvalidTopic},
		{"topic with a quote", func(t *outbox.Task) { t.Topic = "x'; DROP TABLE delay_task; --" }, broker.ErrInvalidTopic},
		{"topic of 128 characters", func(t *outbox.Task) { t.Topic = strings.Repeat("t", 128) }, broker.ErrInvalidTopic},
		{"empty key", func(t *outbox.Task) { t.Key = "" }, broker.ErrInvalidKey},
		{"key of 256 bytes", func(t *outbox.Task) { t.Key = strings.Repeat("k", 256) }, broker.ErrInvalidKey},
		{"key not UTF-8", func(t *outbox.Task) { t.Key = "\xff" }, broker.ErrInvalidKey},
		{"payload one byte over", func(t *outbox.Task) { t.Payload = make([]byte, outbox.DefaultMaxPayload+1) }, outbox.ErrPayloadTooLarge},
		{"zero due time", func(t *outbox.Task) { t.DueAt = time.Time{} }, outbox.ErrInvalidDue},
		{"due in 1970", func(t *outbox.Task) { t.DueAt = time.Unix(5, 0) }, outbox.ErrInvalidDue},
		{"due beyond MaxDelay", func(t *outbox.Task) { t.DueAt = time.Now().AddDate(11, 0, 0) }, broker.ErrTooFar},
		{"due a nanosecond before 2000", func(t *outbox.Task) { t.DueAt = time.Date(1999, 12, 31, 23, 59, 59, 999999999, time.UTC) }, outbox.ErrInvalidDue},
		{"due in year 9999", func(t *outbox.Task) { t.DueAt = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC) }, broker.ErrTooFar},
		{"key with \\x01", func(t *outbox.Task) { t.Key = "o\x011" }, broker.ErrInvalidKey},
		{"key with \\x02", func(t *outbox.Task) { t.Key = "o\x021" }, broker.ErrInvalidKey},
		{"header not UTF-8", func(t *outbox.Task) { t.Headers = map[string]string{"h": "\xfe"} }, broker.ErrInvalidMessage},
		{"header name not UTF-8", func(t *outbox.Task) { t.Headers = map[string]string{"\xfe": "v"} }, broker.ErrInvalidMessage},
		{"empty header name", func(t *outbox.Task) { t.Headers = map[string]string{"": "v"} }, broker.ErrInvalidMessage},
		{"header with \\x01", func(t *outbox.Task) { t.Headers = map[string]string{"h": "a\x01b"} }, broker.ErrInvalidMessage},
		{"one header of 16 KiB", func(t *outbox.Task) { t.Headers = map[string]string{"h": strings.Repeat("v", broker.MaxHeaderBytes)} }, broker.ErrInvalidMessage},
		{"one header of 64 KiB", func(t *outbox.Task) { t.Headers = map[string]string{"h": strings.Repeat("v", 64<<10)} }, broker.ErrInvalidMessage},
		{"1,000 tiny headers", func(t *outbox.Task) { t.Headers = manyHeaders(1000) }, broker.ErrInvalidMessage},
		{"headers whose JSON overflows the column", func(t *outbox.Task) {
			// 15 KiB of NUL is within MaxHeaderBytes but 90 KiB as JSON.
			t.Headers = map[string]string{"h": strings.Repeat("\x00", 15<<10)}
		}, broker.ErrInvalidMessage},
		{"trace over 512 bytes", func(t *outbox.Task) { t.Trace = strings.Repeat("t", 513) }, broker.ErrInvalidMessage},
		{"trace not UTF-8", func(t *outbox.Task) { t.Trace = "\xff" }, broker.ErrInvalidMessage},
		{"trace with \\x02", func(t *outbox.Task) { t.Trace = "00-\x02" }, broker.ErrInvalidMessage},
	} {
		task := ok()
		tc.edit(&task)
		_, err := outbox.Schedule(b.ctx, b.db, task)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Schedule = %v, want %v", tc.name, err, tc.want)
		}
		if err != nil && len(err.Error()) > 600 {
			t.Errorf("%s: an error of %d bytes is not a readable one", tc.name, len(err.Error()))
		}
		if n := b.count(t, "1=1"); n != 0 {
			t.Fatalf("%s: bad input wrote %d rows", tc.name, n)
		}
	}
	exact := ok()
	exact.Payload = make([]byte, outbox.DefaultMaxPayload)
	b.schedule(t, exact)
	if _, err := outbox.New(outbox.Config{MaxPayload: 10}).Schedule(b.ctx, b.db, outbox.Task{Topic: "t", Key: "k", DueAt: time.Now(), Payload: make([]byte, 11)}); !errors.Is(err, outbox.ErrPayloadTooLarge) {
		t.Fatalf("configured MaxPayload not applied: %v", err)
	}
	// A MaxPayload no broker can carry means the ceiling.
	huge := outbox.New(outbox.Config{MaxPayload: 1 << 30})
	if _, err := huge.Schedule(b.ctx, b.db, outbox.Task{Topic: "t", Key: "k", DueAt: time.Now(), Payload: make([]byte, outbox.MaxPayloadCeiling+1)}); !errors.Is(err, outbox.ErrPayloadTooLarge) {
		t.Fatalf("a payload over MaxPayloadCeiling with MaxPayload 1 GiB: %v, want ErrPayloadTooLarge", err)
	}
	if n := b.count(t, "1=1"); n != 1 {
		t.Fatalf("%d rows, want only the payload at exactly the limit", n)
	}
}

func TestSchedule_LargestValidTaskIsWrittenWhole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	headers := map[string]string{}
	// Headers at exactly MaxHeaderBytes: many small ones and a long one.
	size := 0
	for i := range 200 {
		headers[fmt.Sprintf("h%03d", i)] = "v"
		size += broker.HeaderBytes("h000", "v")
	}
	// 12 KiB of <: stored as such, not escaped to \u003c, which would
	// take 72 KiB and overflow the column.
	headers["last"] = strings.Repeat("<", broker.MaxHeaderBytes-size-broker.HeaderBytes("last", ""))
	task := outbox.Task{
		Topic:   strings.Repeat("T", broker.MaxTopicLen),
		Key:     strings.Repeat("订", broker.MaxKeyLen/3),
		DueAt:   time.Now().Add(outbox.DefaultMaxDelay - time.Minute),
		Payload: make([]byte, outbox.DefaultMaxPayload),
		Headers: headers,
		Trace:   strings.Repeat("t", broker.MaxTraceLen),
	}
	b.schedule(t, task)
	info, err := outbox.Get(b.ctx, b.db, task.Topic, task.Key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Task.Key != task.Key || len(info.Task.Payload) != len(task.Payload) || info.Task.Trace != task.Trace || !maps.Equal(info.Task.Headers, headers) {
		t.Fatal("the largest valid task was not stored whole")
	}
}

func TestReschedule_RejectsBadDueAndChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	b.schedule(t, outbox.Task{Topic: "r", Key: "k", DueAt: due})
	for name, bad := range map[string]struct {
		due  time.Time
		want error
	}{
		"zero":            {time.Time{}, outbox.ErrInvalidDue},
		"before 2000":     {time.Unix(0, 0), outbox.ErrInvalidDue},
		"beyond MaxDelay": {time.Now().AddDate(11, 0, 0), broker.ErrTooFar},
		"year 9999":       {time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), broker.ErrTooFar},
	} {
		if err := outbox.Reschedule(b.ctx, b.db, "r", "k", bad.due); !errors.Is(err, bad.want) {
			t.Errorf("%s: Reschedule = %v, want %v", name, err, bad.want)
		}
	}
	info, err := outbox.Get(b.ctx, b.db, "r", "k")
	if err != nil {
		t.Fatal(err)
	}
	if !info.Task.DueAt.Equal(due) || info.Generation != 0 || info.State != outbox.StatePending || !info.UpdatedAt.Equal(info.CreatedAt) {
		t.Fatalf("bad reschedules changed the task: %+v", info)
	}
}

// manyHeaders returns n headers of one byte each.
func manyHeaders(n int) map[string]string {
	h := map[string]string{}
	for i := range n {
		h[fmt.Sprintf("%04d", i)] = "v"
	}
	return h
}

func TestSchedule_MetacharactersRoundTripUnharmed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := `o'1"; DROP TABLE delay_task; -- \ % _ 订单`
	payload := []byte("'\x00\"\\%_\n\r\x1a")
	b.schedule(t, outbox.Task{Topic: "A-z_0-9", Key: key, DueAt: time.Now(), Payload: payload, Headers: map[string]string{"q'uote": `"\`}})
	info, err := outbox.Get(b.ctx, b.db, "A-z_0-9", key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Task.Key != key || string(info.Task.Payload) != string(payload) || info.Task.Headers["q'uote"] != `"\` {
		t.Fatalf("round trip changed the task: %+v", info.Task)
	}
	// Keys are compared byte for byte: another case is another task.
	b.schedule(t, outbox.Task{Topic: "A-z_0-9", Key: strings.ToUpper(key), DueAt: time.Now()})
}

func TestSchedule_TimesAreUTCWhateverTheSessionZone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := mysql.ParseDSN(b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{"time_zone": "'+08:00'"}
	shanghai, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		shanghai = time.FixedZone("CST", 8*3600)
	}
	cfg.Loc = shanghai
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var zone string
	if err := db.QueryRow("SELECT @@session.time_zone").Scan(&zone); err != nil || zone != "+08:00" {
		t.Fatalf("session zone %q (%v), want +08:00", zone, err)
	}
	due := time.Date(2030, 6, 1, 9, 30, 15, 250_000_000, shanghai)
	if _, err := outbox.Schedule(b.ctx, db, outbox.Task{Topic: "tz", Key: "k", DueAt: due}); err != nil {
		t.Fatal(err)
	}
	info, err := outbox.Get(b.ctx, b.db, "tz", "k")
	if err != nil {
		t.Fatal(err)
	}
	if !info.Task.DueAt.Equal(due) || info.Task.DueAt.Location() != time.UTC {
		t.Fatalf("due read back as %v, want %v in UTC", info.Task.DueAt, due.UTC())
	}
	var ms int64
	if err := b.db.QueryRow("SELECT due_ms FROM delay_task WHERE topic = 'tz'").Scan(&ms); err != nil || ms != due.UnixMilli() {
		t.Fatalf("stored due_ms %d, want %d", ms, due.UnixMilli())
	}
}

func TestCancel_StatesAndErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, outbox.Task{Topic: "c", Key: "pending", DueAt: time.Now().Add(time.Hour)})
	if err := outbox.Cancel(b.ctx, b.db, "c", "pending"); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Cancel(b.ctx, b.db, "c", "pending"); err != nil {
		t.Fatalf("cancelling twice = %v, want nil", err)
	}
	if err := outbox.Cancel(b.ctx, b.db, "c", "nope"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Cancel(missing) = %v, want ErrNotFound", err)
	}
	b.schedule(t, outbox.Task{Topic: "c", Key: "done", DueAt: time.Now()})
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'done' WHERE task_key = 'done'"); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Cancel(b.ctx, b.db, "c", "done"); !errors.Is(err, outbox.ErrFinished) {
		t.Fatalf("Cancel(done) = %v, want ErrFinished", err)
	}
	info, _ := outbox.Get(b.ctx, b.db, "c", "pending")
	if info.State != outbox.StateCancelled {
		t.Fatalf("state %s, want cancelled", info.State)
	}
}

func TestReplay_StatesAndErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, st := range []string{"pending", "published", "done", "cancelled"} {
		b.schedule(t, outbox.Task{Topic: "rp", Key: st, DueAt: time.Now().Add(time.Hour)})
		if _, err := b.db.Exec("UPDATE delay_task SET state = ? WHERE topic = 'rp' AND task_key = ?", st, st); err != nil {
			t.Fatal(err)
		}
		if err := outbox.Replay(b.ctx, b.db, "rp", st); !errors.Is(err, outbox.ErrNotDead) || !strings.Contains(err.Error(), "is "+st) {
			t.Fatalf("Replay(%s) = %v, want ErrNotDead naming the state", st, err)
		}
		if info, err := outbox.Get(b.ctx, b.db, "rp", st); err != nil || string(info.State) != st || info.Generation != 0 {
			t.Fatalf("Replay(%s) changed the task: %+v, %v", st, info, err)
		}
	}
	if err := outbox.Replay(b.ctx, b.db, "rp", "nope"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Replay(missing) = %v, want ErrNotFound", err)
	}
}

func TestReschedule_BumpsGenerationAndReturnsToPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, outbox.Task{Topic: "r", Key: "k", DueAt: time.Now().Add(time.Hour)})
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'published', publish_attempts = 1"); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(2 * time.Hour).Truncate(time.Millisecond)
	if err := outbox.Reschedule(b.ctx, b.db, "r", "k", due); err != nil {
		t.Fatal(err)
	}
	info, err := outbox.Get(b.ctx, b.db, "r", "k")
	if err != nil {
		t.Fatal(err)
	}
	if info.State != outbox.StatePending || info.Generation != 1 || !info.Task.DueAt.Equal(due) || info.PublishAttempts != 0 {
		t.Fatalf("after reschedule: %+v", info)
	}
	if err := outbox.Reschedule(b.ctx, b.db, "r", "missing", due); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Reschedule(missing) = %v", err)
	}
	if err := outbox.Reschedule(b.ctx, b.db, "r", "k", time.Time{}); !errors.Is(err, outbox.ErrInvalidDue) {
		t.Fatalf("Reschedule(zero) = %v", err)
	}
	if err := outbox.Cancel(b.ctx, b.db, "r", "k"); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Reschedule(b.ctx, b.db, "r", "k", due); !errors.Is(err, outbox.ErrFinished) {
		t.Fatalf("Reschedule(cancelled) = %v, want ErrFinished", err)
	}
}

func TestScheduleMany_WritesEveryTaskAcrossStatementsOrNoneWhenOneIsInvalidOrRepeated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	due := time.Now().Add(time.Hour)
	tasks := make([]outbox.Task, 1203) // three statements of at most 500 rows
	for i := range tasks {
		tasks[i] = outbox.Task{Topic: "many", Key: fmt.Sprintf("k-%d", i), DueAt: due, Payload: []byte("p"), Headers: map[string]string{"h": "v"}}
	}
	bad := slices.Clone(tasks)
	bad[700] = outbox.Task{Topic: "many", Key: "", DueAt: due}
	if err := outbox.ScheduleMany(b.ctx, b.db, bad); err == nil || !strings.Contains(err.Error(), "task 700") {
		t.Fatalf("ScheduleMany with an empty key at 700 = %v; want an error naming task 700", err)
	}
	if n := b.count(t, "topic = 'many'"); n != 0 {
		t.Fatalf("%d rows written by a refused batch, want 0", n)
	}
	// The same (topic, key) twice, in the third statement's rows: refused
	// before the first statement writes its 500.
	twice := slices.Clone(tasks)
	twice[1100].Key = twice[3].Key
	if err := outbox.ScheduleMany(b.ctx, b.db, twice); !errors.Is(err, outbox.ErrDuplicate) || !strings.Contains(err.Error(), "tasks 3 and 1100") {
		t.Fatalf("ScheduleMany with task 1100 repeating task 3 = %v; want ErrDuplicate naming both", err)
	}
	if n := b.count(t, "topic = 'many'"); n != 0 {
		t.Fatalf("%d rows written by a batch repeating a key, want 0", n)
	}
	if err := outbox.ScheduleMany(b.ctx, b.db, tasks); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "topic = 'many' AND state = 'pending'"); n != len(tasks) {
		t.Fatalf("%d pending rows, want %d", n, len(tasks))
	}
	info, err := outbox.Get(b.ctx, b.db, "many", "k-1202")
	if err != nil || info.Task.DueAt.UnixMilli() != broker.DueMillis(due) || string(info.Task.Payload) != "p" || info.Task.Headers["h"] != "v" {
		t.Fatalf("last task %+v, %v", info, err)
	}
	err = outbox.ScheduleMany(b.ctx, b.db, []outbox.Task{{Topic: "many", Key: "new", DueAt: due}, {Topic: "many", Key: "k-5", DueAt: due}})
	if !errors.Is(err, outbox.ErrDuplicate) {
		t.Fatalf("a batch with a key already scheduled = %v; want ErrDuplicate", err)
	}
}

func TestSchedule_DueBefore2000UTCIsRefusedInAnyTimeZone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	plusOne := time.FixedZone("+01:00", 3600)
	due := time.Date(2000, 1, 1, 0, 30, 0, 0, plusOne) // 1999-12-31T23:30Z
	_, err := outbox.Schedule(b.ctx, b.db, outbox.Task{Topic: "bound", Key: "k", DueAt: due})
	if !errors.Is(err, outbox.ErrInvalidDue) {
		t.Fatalf("Schedule(%v) = %v, want ErrInvalidDue", due, err)
	}
	if b.count(t, "topic = 'bound'") != 0 {
		t.Fatal("a refused task was written")
	}
	if err := (&broker.Message{Topic: "bound", Key: "k", DeliverAt: due}).Validate(); !errors.Is(err, broker.ErrInvalidMessage) {
		t.Fatalf("Message.Validate(%v) = %v, want ErrInvalidMessage", due, err)
	}
}

func TestReschedule_ResetsTheRescueBackoffAndAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, outbox.Task{Topic: "reset", Key: "k", DueAt: time.Now()})
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'published', rescues = 8, attempts = 5, lease_owner = 7 WHERE task_key = 'k'"); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Reschedule(b.ctx, b.db, "reset", "k", time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := b.count(t, "task_key = 'k' AND rescues = 0 AND attempts = 0 AND lease_owner = 0 AND next_attempt_ms = 0"); got != 1 {
		t.Fatal("Reschedule kept the old rescue count, attempts or lease")
	}
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'dead', rescues = 8, attempts = 5 WHERE task_key = 'k'"); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Replay(b.ctx, b.db, "reset", "k"); err != nil {
		t.Fatal(err)
	}
	if got := b.count(t, "task_key = 'k' AND rescues = 0 AND attempts = 0"); got != 1 {
		t.Fatal("Replay kept the old rescue count or attempts")
	}
}

// Cancel reaches a task wherever it is before it finished: waiting
// (pending), in the broker (published) and given up on (dead). A done task
// stays done.
func TestCancel_PendingPublishedAndDeadTasksAreCancelledADoneOneIsNot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, st := range []string{"pending", "published", "dead", "done"} {
		b.schedule(t, outbox.Task{Topic: "cx", Key: st, DueAt: time.Now().Add(-time.Minute)})
		if _, err := b.db.Exec("UPDATE delay_task SET state = ? WHERE topic = 'cx' AND task_key = ?", st, st); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []string{"pending", "published", "dead"} {
		if err := outbox.Cancel(b.ctx, b.db, "cx", st); err != nil {
			t.Errorf("Cancel(%s task) = %v, want nil", st, err)
		}
		if info, err := outbox.Get(b.ctx, b.db, "cx", st); err != nil || info.State != outbox.StateCancelled {
			t.Errorf("%s task after Cancel: %+v, %v; want cancelled", st, info, err)
		}
	}
	if err := outbox.Cancel(b.ctx, b.db, "cx", "done"); !errors.Is(err, outbox.ErrFinished) {
		t.Errorf("Cancel(done task) = %v, want ErrFinished", err)
	}
	if info, err := outbox.Get(b.ctx, b.db, "cx", "done"); err != nil || info.State != outbox.StateDone {
		t.Errorf("done task after Cancel: %+v, %v; want done", info, err)
	}
}

// Reschedule moves a pending, published or dead task to a new due time as
// a fresh pending task of the next generation: nothing of its last publish
// is kept. A done or cancelled task is never brought back: its effect ran
// (or must never run).
func TestReschedule_MovesUnfinishedTasksAndNeverRevivesAFinishedOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	for _, st := range []string{"pending", "published", "dead", "done", "cancelled"} {
		b.schedule(t, outbox.Task{Topic: "rs", Key: st, DueAt: old})
		if _, err := b.db.Exec(`UPDATE delay_task SET state = ?, published_ms = ?, last_error = 'publish failed: reset', publish_attempts = 2
WHERE topic = 'rs' AND task_key = ?`, st, old.UnixMilli(), st); err != nil {
			t.Fatal(err)
		}
	}
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	for _, st := range []string{"pending", "published", "dead"} {
		if err := outbox.Reschedule(b.ctx, b.db, "rs", st, due); err != nil {
			t.Errorf("Reschedule(%s task) = %v, want nil", st, err)
			continue
		}
		info, err := outbox.Get(b.ctx, b.db, "rs", st)
		if err != nil {
			t.Fatal(err)
		}
		if info.State != outbox.StatePending || info.Generation != 1 || !info.Task.DueAt.Equal(due) ||
			!info.PublishedAt.IsZero() || info.LastError != "" || info.PublishAttempts != 0 {
			t.Errorf("%s task after Reschedule: %+v; want pending, generation 1, the new due time, no publish or error kept", st, info)
		}
	}
	for _, st := range []string{"done", "cancelled"} {
		if err := outbox.Reschedule(b.ctx, b.db, "rs", st, due); !errors.Is(err, outbox.ErrFinished) {
			t.Errorf("Reschedule(%s task) = %v, want ErrFinished", st, err)
		}
		info, err := outbox.Get(b.ctx, b.db, "rs", st)
		if err != nil {
			t.Fatal(err)
		}
		if string(info.State) != st || info.Generation != 0 || !info.Task.DueAt.Equal(old) {
			t.Errorf("%s task after a refused Reschedule: %+v; want it unchanged", st, info)
		}
	}
}

// A configured MaxDelay bounds Schedule and Reschedule, not only the
// default ten years.
func TestOutbox_ConfiguredMaxDelayBoundsScheduleAndReschedule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := outbox.New(outbox.Config{MaxDelay: time.Hour})
	if _, err := o.Schedule(b.ctx, b.db, outbox.Task{Topic: "md", Key: "far", DueAt: time.Now().Add(2 * time.Hour)}); !errors.Is(err, broker.ErrTooFar) {
		t.Fatalf("Schedule 2h out under MaxDelay 1h = %v, want ErrTooFar", err)
	}
	if _, err := o.Schedule(b.ctx, b.db, outbox.Task{Topic: "md", Key: "near", DueAt: time.Now().Add(30 * time.Minute)}); err != nil {
		t.Fatalf("Schedule 30m out under MaxDelay 1h = %v", err)
	}
	if err := o.Reschedule(b.ctx, b.db, "md", "near", time.Now().Add(2*time.Hour)); !errors.Is(err, broker.ErrTooFar) {
		t.Fatalf("Reschedule 2h out under MaxDelay 1h = %v, want ErrTooFar", err)
	}
	if n := b.count(t, "topic = 'md' AND generation = 0"); n != 1 {
		t.Fatalf("%d tasks of generation 0, want only the one scheduled near", n)
	}
}

// A due time between two milliseconds is stored as the later one: stored
// as the earlier, the handler could run up to a millisecond before the
// instant the caller asked for. Each way in (Schedule, ScheduleMany,
// Reschedule) rounds up; an exact millisecond stays as it is.
func TestSchedule_DueTimesRoundUpToTheMillisecond(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exact := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	between := exact.Add(300 * time.Microsecond)
	stored := func(key string) int64 {
		t.Helper()
		var ms int64
		if err := b.db.QueryRow("SELECT due_ms FROM delay_task WHERE topic = 'ms' AND task_key = ?", key).Scan(&ms); err != nil {
			t.Fatal(err)
		}
		return ms
	}
	if _, err := outbox.Schedule(b.ctx, b.db, outbox.Task{Topic: "ms", Key: "one", DueAt: between}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.ScheduleMany(b.ctx, b.db, []outbox.Task{{Topic: "ms", Key: "many", DueAt: between}, {Topic: "ms", Key: "exact", DueAt: exact}}); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Schedule(b.ctx, b.db, outbox.Task{Topic: "ms", Key: "moved", DueAt: exact}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Reschedule(b.ctx, b.db, "ms", "moved", between.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]int64{
		"one":   exact.UnixMilli() + 1,
		"many":  exact.UnixMilli() + 1,
		"exact": exact.UnixMilli(),
		"moved": exact.UnixMilli() + 1001,
	} {
		if got := stored(key); got != want {
			t.Errorf("%s: stored due_ms %d, want %d", key, got, want)
		}
	}
}
