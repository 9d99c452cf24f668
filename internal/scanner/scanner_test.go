package scanner_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/store"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

type bundle struct {
	db  *sql.DB
	mem *memory.Broker
	ctx context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db, _ := testenv.ScratchDB(t)
	ctx := context.Background()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	return &bundle{db: db, mem: mem, ctx: ctx}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// task writes a task and forces it into state with the given due time.
func (b *bundle) task(t *testing.T, key string, state outbox.State, due time.Time) {
	t.Helper()
	if _, err := outbox.Schedule(b.ctx, b.db, outbox.Task{Topic: "scan", Key: key, DueAt: due}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec("UPDATE delay_task SET state = ? WHERE task_key = ?", string(state), key); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) scanner(t *testing.T, pub broker.Publisher, cfg scanner.Config) *scanner.Scanner {
	t.Helper()
	cfg.Logger = quiet()
	if cfg.Grace == 0 {
		cfg.Grace = time.Second
	}
	s, err := scanner.New(b.db, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestScanner_RescuesOnlyOverduePublishedTasks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := time.Now().Add(-time.Minute)
	b.task(t, "lost", outbox.StatePublished, old)
	b.task(t, "in-flight", outbox.StatePublished, time.Now().Add(time.Minute))
	b.task(t, "just-due", outbox.StatePublished, time.Now())
	b.task(t, "done", outbox.StateDone, old)
	b.task(t, "cancelled", outbox.StateCancelled, old)
	b.task(t, "pending", outbox.StatePending, old)
	b.task(t, "dead", outbox.StateDead, old)
	s := b.scanner(t, b.mem, scanner.Config{Grace: 5 * time.Second})
	if n, err := s.Rescue(b.ctx); err != nil || n != 1 {
		t.Fatalf("Rescue = %d, %v; want only the lost task", n, err)
	}
	info, _ := outbox.Get(b.ctx, b.db, "scan", "lost")
	if info.Rescues != 1 || info.State != outbox.StatePublished {
		t.Fatalf("lost task after rescue: %+v", info)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	ch, _ := b.mem.Subscribe(ctx, "scan")
	if d := <-ch; d.Message.Key != "lost" || d.Message.TaskID != info.ID {
		t.Fatalf("re-published %+v", d.Message)
	}
	// Not again on the next pass: the rescue is stamped.
	if n, err := s.Rescue(b.ctx); err != nil || n != 0 {
		t.Fatalf("second Rescue = %d, %v; want 0", n, err)
	}
}

func TestScanner_HoldsWhileItsLastRescueIsUnhandled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 30
	for i := range n {
		b.task(t, fmt.Sprint(i), outbox.StatePublished, time.Now().Add(-time.Hour))
	}
	now := time.Now()
	clock := func() time.Time { return now }
	// A Grace longer than the hold: no task comes due for a second rescue
	// within this test, so the third pass must take the last ten.
	s := b.scanner(t, b.mem, scanner.Config{BatchSize: 10, Grace: 2 * time.Minute, HoldWhileBehind: time.Minute, Now: clock})
	rescue := func(want int, why string) {
		t.Helper()
		if got, err := s.Rescue(b.ctx); err != nil || got != want {
			t.Fatalf("%s: Rescue = %d, %v; want %d", why, got, err, want)
		}
	}
	rescue(10, "first pass")
	rescue(0, "nothing of the first rescue handled yet")
	// Four of ten handled: still behind.
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'done' WHERE rescues = 1 ORDER BY id LIMIT 4"); err != nil {
		t.Fatal(err)
	}
	rescue(0, "four of ten handled")
	// A fifth: half of the rescue is done, the consumers keep up.
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'done' WHERE rescues = 1 AND state = 'published' ORDER BY id LIMIT 1"); err != nil {
		t.Fatal(err)
	}
	rescue(10, "half of the first rescue handled")
	rescue(0, "second rescue unhandled")
	// Nobody handles anything, but the hold ends after HoldWhileBehind.
	now = now.Add(time.Minute)
	rescue(10, "hold expired")
	var total int
	if err := b.db.QueryRow("SELECT COUNT(*) FROM delay_task WHERE rescues = 1").Scan(&total); err != nil || total != n {
		t.Fatalf("tasks rescued once = %d, %v; want %d", total, err, n)
	}
}

// The hold is per topic: while the rescue of one topic (its consumers
// down) stays unhandled, another topic's lost messages are still rescued,
// though the held topic's overdue tasks come first in the index. Held as
// a whole, the scanner rescued nothing of the other topic until the hold
// expired, and again after each rescue of the first.
func TestScanner_HoldsOnlyTheTopicWhoseRescueIsUnhandled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 30 {
		b.task(t, fmt.Sprint("down-", i), outbox.StatePublished, time.Now().Add(-2*time.Hour))
	}
	for i := range 3 {
		if _, err := outbox.Schedule(b.ctx, b.db, outbox.Task{Topic: "lost", Key: fmt.Sprint("lost-", i), DueAt: time.Now().Add(-time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'published' WHERE topic = 'lost'"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	s := b.scanner(t, b.mem, scanner.Config{BatchSize: 10, Grace: 2 * time.Minute, HoldWhileBehind: time.Minute, Now: func() time.Time { return now }})
	rescued := func(topic string) int {
		t.Helper()
		var n int
		if err := b.db.QueryRow("SELECT COUNT(*) FROM delay_task WHERE topic = ? AND rescues > 0", topic).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	rescue := func(want int, why string) {
		t.Helper()
		if got, err := s.Rescue(b.ctx); err != nil || got != want {
			t.Fatalf("%s: Rescue = %d, %v; want %d", why, got, err, want)
		}
	}
	rescue(10, "first pass: the oldest, all of the topic whose consumers are down")
	rescue(3, "second pass: that topic held, the other's lost messages")
	if n := rescued("lost"); n != 3 {
		t.Fatalf("%d of topic lost rescued, want 3", n)
	}
	rescue(0, "both topics held")
	// The lost messages are handled; the other topic stays held.
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'done' WHERE topic = 'lost'"); err != nil {
		t.Fatal(err)
	}
	rescue(0, "topic lost handled, nothing of it left; the other still held")
	if n := rescued("scan"); n != 10 {
		t.Fatalf("%d of the held topic rescued, want the first 10 only", n)
	}
	now = now.Add(time.Minute)
	rescue(10, "the hold on the first topic expired")
}

func TestScanner_TwoScannersRescueEachTaskOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 2000
	tx, _ := b.db.Begin()
	for i := range n {
		if _, err := outbox.Schedule(b.ctx, tx, outbox.Task{Topic: "scan", Key: fmt.Sprint(i), DueAt: time.Now().Add(-time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec("UPDATE delay_task SET state = 'published'"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	pub := publishFunc(func(ctx context.Context, msgs ...*broker.Message) error {
		mu.Lock()
		for _, m := range msgs {
			seen[m.Key]++
		}
		mu.Unlock()
		return nil
	})
	var wg sync.WaitGroup
	for range 2 {
		// No consumer here: nothing would ever release the hold.
		s := b.scanner(t, pub, scanner.Config{BatchSize: 100, HoldWhileBehind: -1})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				got, err := s.Rescue(b.ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if got == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("%d tasks rescued, want %d", len(seen), n)
	}
	for k, c := range seen {
		if c != 1 {
			t.Fatalf("task %s rescued %d times", k, c)
		}
	}
	var rescues int
	if err := b.db.QueryRow("SELECT SUM(rescues) FROM delay_task").Scan(&rescues); err != nil || rescues != n {
		t.Fatalf("rescue count %d (%v), want %d", rescues, err, n)
	}
}

type publishFunc func(ctx context.Context, msgs ...*broker.Message) error

func (f publishFunc) Publish(ctx context.Context, msgs ...*broker.Message) error {
	return f(ctx, msgs...)
}
func (f publishFunc) Limits() broker.Limits { return broker.Limits{} }

func TestScanner_KilledMidPassLeavesNothingHalfDone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.task(t, "lost", outbox.StatePublished, time.Now().Add(-time.Minute))
	// A pass whose publish never returns (the process hangs, then dies):
	// its lease keeps other scanners off the row until it expires, and the
	// row is rescued then, never lost and never counted twice.
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	started := make(chan struct{})
	hang := publishFunc(func(context.Context, ...*broker.Message) error { close(started); <-ctx.Done(); return ctx.Err() })
	go func() {
		_, _ = b.scanner(t, hang, scanner.Config{PublishTimeout: time.Hour, Lease: 2 * time.Hour}).Rescue(ctx)
	}()
	<-started
	if n, err := b.scanner(t, b.mem, scanner.Config{}).Rescue(b.ctx); n != 0 || err != nil {
		t.Fatalf("a pass during the hung pass's lease rescued %d (%v), want 0", n, err)
	}
	if info, _ := outbox.Get(b.ctx, b.db, "scan", "lost"); info.Rescues != 0 {
		t.Fatalf("a hung pass counted %d rescues", info.Rescues)
	}
	later := func() time.Time { return time.Now().Add(3 * time.Hour) }
	if n, err := b.scanner(t, b.mem, scanner.Config{Now: later}).Rescue(b.ctx); n != 1 || err != nil {
		t.Fatalf("the pass after the lease rescued %d (%v), want 1", n, err)
	}
}

func TestScanner_BacklogCountsStuckPendingAndDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.task(t, "stuck", outbox.StatePending, time.Now().Add(-time.Hour))
	b.task(t, "fresh", outbox.StatePending, time.Now())
	b.task(t, "future", outbox.StatePending, time.Now().Add(time.Hour))
	b.task(t, "dead-1", outbox.StateDead, time.Now())
	b.task(t, "dead-2", outbox.StateDead, time.Now())
	var hooked [2]int
	s := b.scanner(t, b.mem, scanner.Config{Hooks: scanner.Hooks{Backlog: func(p, d int) { hooked = [2]int{p, d} }}})
	p, d, err := s.Backlog(b.ctx)
	if err != nil || p != 1 || d != 2 || hooked != [2]int{1, 2} {
		t.Fatalf("Backlog = %d, %d, %v (hook %v); want 1 stuck pending and 2 dead", p, d, err, hooked)
	}
}

func TestScanner_BusinessSourceRunsOnOneScannerAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	entered, release := make(chan struct{}, 2), make(chan struct{})
	var mu sync.Mutex
	var handled []string
	src := &scanner.Business{
		Name: "unpaid-orders",
		Query: func(ctx context.Context, db *sql.DB, limit int) ([]string, error) {
			entered <- struct{}{}
			<-release
			return []string{"o1", "o2"}, nil
		},
		Handle: func(ctx context.Context, key string) error {
			mu.Lock()
			handled = append(handled, key)
			mu.Unlock()
			return nil
		},
	}
	s1 := b.scanner(t, b.mem, scanner.Config{Business: src})
	s2 := b.scanner(t, b.mem, scanner.Config{Business: src})
	done := make(chan int)
	go func() { n, _ := s1.RunBusiness(b.ctx); done <- n }()
	<-entered
	// Were the source not held, the second scanner would block in Query
	// until release: bound the wait, so a broken hold fails here.
	second := make(chan error, 1)
	go func() {
		n, err := s2.RunBusiness(b.ctx)
		if err == nil && n != 0 {
			err = fmt.Errorf("handled %d keys", n)
		}
		second <- err
	}()
	select {
	case err := <-second:
		if err != nil {
			t.Fatalf("second scanner while the first held the source: %v", err)
		}
	case <-entered:
		close(release)
		t.Fatal("second scanner ran the source while the first held it")
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("second scanner neither returned nor ran the source in 10 s")
	}
	close(release)
	if n := <-done; n != 2 {
		t.Fatalf("first scanner handled %d keys, want 2", n)
	}
	if strings.Join(handled, ",") != "o1,o2" {
		t.Fatalf("handled %v", handled)
	}
}

func TestScanner_OverdueQueryIsAnIndexRangeScan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 50 {
		b.task(t, fmt.Sprint(i), outbox.StateDone, time.Now().Add(-time.Hour))
	}
	// The scanner's look and claim, as it runs them.
	cut := time.Now().Add(-time.Minute).UnixMilli()
	spec := store.ClaimSpec{State: store.Published, DueAtMost: cut, ReadyAtMost: cut, PublishedAtMost: cut, Limit: 500}
	look, err := store.FirstQuery(spec)
	if err != nil {
		t.Fatal(err)
	}
	claim, args := store.ClaimQuery(spec)
	// The same with topics held (Config.HoldWhileBehind).
	held := spec
	held.ExcludeTopics = []string{"scan", "other-topic"}
	heldLook, err := store.FirstQuery(held)
	if err != nil {
		t.Fatal(err)
	}
	heldClaim, heldArgs := store.ClaimQuery(held)
	if !strings.Contains(heldLook, "NOT IN ('scan','other-topic')") || !strings.Contains(heldClaim, "topic NOT IN (?,?)") {
		t.Errorf("held topics not left out:\n%s\n%s", heldLook, heldClaim)
	}
	// A name that is no topic is never written into the look.
	held.ExcludeTopics = []string{"x') OR ('1'='1"}
	if q, err := store.FirstQuery(held); err == nil {
		t.Errorf("FirstQuery wrote an invalid topic into %s", q)
	}
	for name, q := range map[string]struct {
		query string
		args  []any
	}{"look": {look, nil}, "claim": {claim, args}, "look with topics held": {heldLook, nil}, "claim with topics held": {heldClaim, heldArgs}} {
		var (
			id                                                 int
			selectType, table, typ, possible, key, keyLen, ref sql.NullString
			rows                                               sql.NullInt64
			extra                                              sql.NullString
		)
		err := b.db.QueryRow("EXPLAIN "+q.query, q.args...).
			Scan(&id, &selectType, &table, &typ, &possible, &key, &keyLen, &ref, &rows, &extra)
		if err != nil {
			t.Fatal(name, err)
		}
		if typ.String != "range" || key.String != "ix_delay_task_state_due" || strings.Contains(extra.String, "filesort") {
			t.Errorf("%s: EXPLAIN type=%s key=%s extra=%s; want a range scan of ix_delay_task_state_due without filesort", name, typ.String, key.String, extra.String)
		}
	}
}

func TestNew_RejectsBadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := scanner.New(nil, b.mem, scanner.Config{}); err == nil {
		t.Error("nil db accepted")
	}
	if _, err := scanner.New(b.db, b.mem, scanner.Config{Business: &scanner.Business{Name: "x"}}); err == nil {
		t.Error("business source without Query/Handle accepted")
	}
	bad := &scanner.Business{Name: "bad name", Query: func(context.Context, *sql.DB, int) ([]string, error) { return nil, nil }, Handle: func(context.Context, string) error { return nil }}
	if _, err := scanner.New(b.db, b.mem, scanner.Config{Business: bad}); err == nil {
		t.Error("business source name with a space accepted")
	}
	// A lease that ends before the publish may: another scanner would take
	// the rows while this one still publishes them.
	if _, err := scanner.New(b.db, b.mem, scanner.Config{PublishTimeout: time.Minute, Lease: time.Minute}); err == nil || !strings.Contains(err.Error(), "Lease") {
		t.Errorf("Lease equal to PublishTimeout: %v, want an error naming Lease", err)
	}
}

// A pass with nothing to rescue reads the index once and opens no
// transaction; one with a task to rescue claims it. Transactions are
// counted on the scanner's one connection.
func TestScanner_APassWithNothingOverdueOpensNoTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.SetMaxOpenConns(1)
	b.task(t, "in-flight", outbox.StatePublished, time.Now().Add(time.Minute))
	b.task(t, "done", outbox.StateDone, time.Now().Add(-time.Minute))
	s := b.scanner(t, b.mem, scanner.Config{})
	begins := func() int {
		t.Helper()
		var name string
		var n int
		if err := b.db.QueryRow("SHOW SESSION STATUS LIKE 'Com_begin'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := begins()
	for range 10 {
		if n, err := s.Rescue(b.ctx); err != nil || n != 0 {
			t.Fatalf("Rescue = %d, %v; want nothing", n, err)
		}
	}
	if n := begins() - before; n != 0 {
		t.Fatalf("10 passes with nothing overdue began %d transactions, want 0", n)
	}
	b.task(t, "lost", outbox.StatePublished, time.Now().Add(-time.Minute))
	if n, err := s.Rescue(b.ctx); err != nil || n != 1 {
		t.Fatalf("Rescue = %d, %v; want the lost task", n, err)
	}
}
