package delaybridge_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// clientBundle is what a Client test on the real services needs.
type clientBundle struct {
	ctx context.Context
	db  *sql.DB
	cfg delaybridge.Config
	// rabbit is cfg's adapter configuration.
	rabbit rabbit.Config
}

// on returns b.cfg on the adapter rc configures.
func (b *clientBundle) on(rc rabbit.Config) delaybridge.Config {
	c := b.cfg
	c.Broker = rabbit.New(rc)
	return c
}

// setup gives a test a scratch database and a RabbitMQ ladder of its own;
// its Config relays in process.
func setup(t *testing.T) *clientBundle {
	t.Helper()
	testenv.SkipIfShort(t, "needs MariaDB and RabbitMQ")
	db, _ := testenv.ScratchDB(t)
	ctx := context.Background()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	url, prefix := testenv.AMQP(t), testenv.Name("client")
	t.Cleanup(func() { testenv.DeleteRabbitPrefix(t, url, prefix) })
	rc := rabbit.Config{URL: url, Prefix: prefix, Depth: 8}
	return &clientBundle{ctx: ctx, db: db, rabbit: rc, cfg: delaybridge.Config{Broker: rabbit.New(rc),
		Relay: &delaybridge.RelayConfig{IdleMax: 50 * time.Millisecond}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}
}

// schedule commits one task due now.
func (b *clientBundle) schedule(t *testing.T, c *delaybridge.Client, topic, key string) {
	t.Helper()
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := c.Schedule(b.ctx, tx, outbox.Task{Topic: topic, Key: key, DueAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func TestClient_StopWaitsForTheRunningHandlerThenItsTaskIsDone(t *testing.T) {
	b := setup(t)
	c, err := delaybridge.NewClient(b.db, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan string, 1), make(chan struct{})
	err = c.Handle("drain", func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		entered <- m.Key
		<-release
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.schedule(t, c, "drain", "k1")
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never ran")
	}
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- c.Stop(ctx)
	}()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned %v while a handler was running", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("Stop = %v", err)
	}
	info, err := c.Get(b.ctx, b.db, "drain", "k1")
	if err != nil || info.State != outbox.StateDone {
		t.Fatalf("task after the drain: %+v, %v; want done", info, err)
	}
	if err := c.Start(b.ctx); !errors.Is(err, delaybridge.ErrStarted) {
		t.Errorf("Start after Stop = %v, want ErrStarted", err)
	}
}

func TestClient_StopPastItsDeadlineRollsTheHandlerBack(t *testing.T) {
	b := setup(t)
	c, err := delaybridge.NewClient(b.db, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{}, 1)
	err = c.Handle("stuck", func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		entered <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.schedule(t, c, "stuck", "k1")
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never ran")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want the deadline's error", err)
	}
	info, err := c.Get(b.ctx, b.db, "stuck", "k1")
	if err != nil || info.State == outbox.StateDone {
		t.Fatalf("task after an abandoned handler: %+v, %v; want not done", info, err)
	}
}

func TestClient_StartRefusesAPrefixOtherThanALiveConsumers(t *testing.T) {
	b := setup(t)
	noop := func(context.Context, *sql.Tx, *broker.Message) error { return nil }
	first, err := delaybridge.NewClient(b.db, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Handle("shop-cancel", noop); err != nil {
		t.Fatal(err)
	}
	if err := first.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	defer first.Stop(b.ctx)

	shop := b.rabbit
	shop.Prefix = testenv.Name("shop")
	other := b.on(shop)
	other.Relay = nil
	t.Cleanup(func() { testenv.DeleteRabbitPrefix(t, shop.URL, shop.Prefix) })
	second, err := delaybridge.NewClient(b.db, other)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Handle("shop-cancel", noop); err != nil {
		t.Fatal(err)
	}
	err = second.Start(b.ctx)
	if !errors.Is(err, outbox.ErrTopologyMismatch) {
		_ = second.Stop(b.ctx)
		t.Fatalf("Start with prefix %q beside a consumer on %q = %v; want ErrTopologyMismatch", shop.Prefix, b.rabbit.Prefix, err)
	}
	if !strings.Contains(err.Error(), shop.Prefix) || !strings.Contains(err.Error(), b.rabbit.Prefix) {
		t.Errorf("error %q does not name both prefixes", err)
	}
	// Rolling a change out process by process: with WarnOnly it starts.
	other.Presence.WarnOnly = true
	third, err := delaybridge.NewClient(b.db, other)
	if err != nil {
		t.Fatal(err)
	}
	if err := third.Handle("shop-cancel", noop); err != nil {
		t.Fatal(err)
	}
	if err := third.Start(b.ctx); err != nil {
		t.Fatalf("Start with Presence.WarnOnly beside another prefix = %v; want it started", err)
	}
	if err := third.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
}

// A Start that fails after the consumer announced itself leaves nothing
// behind: no live presence (status would show a consumer that is not
// there) and no consumer. Here the relay's lookahead passes NewClient (the
// broker's limits are not known yet) and is refused once the ladder's
// longest hop is.
func TestClient_AFailedStartWithdrawsItsPresence(t *testing.T) {
	b := setup(t)
	rc := b.rabbit
	rc.Unit, rc.Depth = 100*time.Millisecond, 4 // one hop: 1.5 s
	cfg := b.on(rc)
	cfg.Relay = &delaybridge.RelayConfig{Lookahead: 10 * time.Second}
	c, err := delaybridge.NewClient(b.db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Handle("withdrawn", func(context.Context, *sql.Tx, *broker.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err == nil || !strings.Contains(err.Error(), "longer than one broker hop") {
		_ = c.Stop(b.ctx)
		t.Fatalf("Start = %v, want the relay's lookahead refused", err)
	}
	live, err := outbox.LivePresences(b.ctx, b.db, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 0 {
		t.Fatalf("after a failed Start, %d live presence records: %+v", len(live), live)
	}
}

// A consuming service rolled out before the migrations it needs refuses
// to start, naming what is missing, and announces nothing.
func TestClient_StartRefusesADatabaseBehindItsMigrations(t *testing.T) {
	b := setup(t)
	migs, err := outbox.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	last := migs[len(migs)-1].Version
	if _, err := b.db.ExecContext(b.ctx, "DELETE FROM delaybridge_migration WHERE version = ?", last); err != nil {
		t.Fatal(err)
	}
	c, err := delaybridge.NewClient(b.db, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Handle("behind", func(context.Context, *sql.Tx, *broker.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); !errors.Is(err, outbox.ErrSchemaBehind) {
		_ = c.Stop(b.ctx)
		t.Fatalf("Start on a database without migration %d = %v, want ErrSchemaBehind", last, err)
	}
	live, err := outbox.LivePresences(b.ctx, b.db, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 0 {
		t.Fatalf("after a refused Start, %d live presence records: %+v", len(live), live)
	}
}

// Stop with the context that ended the service (cancelled already) stops
// an idle Client cleanly; and Stop's context bounds it even when a
// scanner's business source ignores its own context.
func TestClient_StopIsBoundedByItsContext(t *testing.T) {
	b := setup(t)
	noop := func(context.Context, *sql.Tx, *broker.Message) error { return nil }
	c, err := delaybridge.NewClient(b.db, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Handle("idle-stop", noop); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(b.ctx)
	cancel()
	if err := c.Stop(ended); err != nil {
		t.Fatalf("Stop of an idle Client with a cancelled context = %v, want nil", err)
	}

	entered, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	cfg := b.cfg
	cfg.Relay = nil
	cfg.Scanner = &scanner.Config{Business: &scanner.Business{Name: "stubborn", Every: 10 * time.Millisecond,
		Query: func(ctx context.Context, db *sql.DB, limit int) ([]string, error) {
			select {
			case <-entered:
			default:
				close(entered)
			}
			<-release // ignores ctx
			return nil, nil
		},
		Handle: func(context.Context, string) error { return nil }}}
	stubborn, err := delaybridge.NewClient(b.db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := stubborn.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the business source never ran")
	}
	ctx, cancel2 := context.WithTimeout(b.ctx, 200*time.Millisecond)
	defer cancel2()
	stopped := make(chan error, 1)
	go func() { stopped <- stubborn.Stop(ctx) }()
	select {
	case err := <-stopped:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Stop with a business source that ignores its context = %v, want the deadline", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Stop waited on a business source past its context")
	}
}

// finishedLongAgo schedules a task and marks it done eight days ago, past
// the cleaner's default retention of a week.
func (b *clientBundle) finishedLongAgo(t *testing.T, c *delaybridge.Client, key string) {
	t.Helper()
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	id, err := c.Schedule(b.ctx, tx, outbox.Task{Topic: "retained", Key: key, DueAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	ago := (8 * 24 * time.Hour).Milliseconds()
	if _, err := tx.ExecContext(b.ctx, "UPDATE delay_task SET state = 'done', due_ms = due_ms - ?, updated_ms = updated_ms - ? WHERE id = ?", ago, ago, id); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// relays counts the live relay presence records.
func (b *clientBundle) relays(t *testing.T) int {
	t.Helper()
	live, err := outbox.LivePresences(b.ctx, b.db, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range live {
		if p.Role == outbox.RoleRelay {
			n++
		}
	}
	return n
}

// A Client that relays runs what delaybridge run runs beside its relay:
// the cleaner, the counts refresher and a relay presence record, so a
// service that is its own daemon neither piles up finished tasks nor
// shows as NO RELAY in status. NoCleaner and NoStats turn the first two
// off.
func TestClient_ThatRelaysRunsWhatRunRunsBesideIt(t *testing.T) {
	t.Run("CleansCountsAndAnnouncesARelay", func(t *testing.T) {
		b := setup(t)
		c, err := delaybridge.NewClient(b.db, b.cfg)
		if err != nil {
			t.Fatal(err)
		}
		b.finishedLongAgo(t, c, "old")
		if err := c.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		if n := b.relays(t); n != 1 {
			_ = c.Stop(b.ctx)
			t.Fatalf("a started Client with a Relay: %d live relay records, want 1", n)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, gerr := c.Get(b.ctx, b.db, "retained", "old")
			st, serr := ops.ReadStats(b.ctx, b.db, time.Now(), time.Minute, 0)
			if serr != nil {
				t.Fatal(serr)
			}
			if errors.Is(gerr, outbox.ErrNotFound) && !st.CountsAt.IsZero() {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Stop(b.ctx)
				t.Fatalf("after 30 s: Get of a task done 8 days ago = %v (want ErrNotFound: the cleaner deleted it), counts at %v (want a refresh)", gerr, st.CountsAt)
			}
			time.Sleep(50 * time.Millisecond)
		}
		sctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		defer cancel()
		if err := c.Stop(sctx); err != nil {
			t.Fatal(err)
		}
		if n := b.relays(t); n != 0 {
			t.Fatalf("after Stop: %d live relay records, want 0", n)
		}
	})
	t.Run("NoCleanerAndNoStatsTurnThemOff", func(t *testing.T) {
		b := setup(t)
		cfg := b.cfg
		cfg.NoCleaner, cfg.NoStats = true, true
		c, err := delaybridge.NewClient(b.db, cfg)
		if err != nil {
			t.Fatal(err)
		}
		b.finishedLongAgo(t, c, "kept")
		if err := c.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		// The cleaner and the refresher start with a pass; a second is
		// ample for one that runs.
		time.Sleep(time.Second)
		_, gerr := c.Get(b.ctx, b.db, "retained", "kept")
		st, serr := ops.ReadStats(b.ctx, b.db, time.Now(), time.Minute, 0)
		relays := b.relays(t)
		if err := c.Stop(b.ctx); err != nil {
			t.Fatal(err)
		}
		if gerr != nil || serr != nil {
			t.Fatalf("with NoCleaner: Get = %v, ReadStats = %v; want the task kept", gerr, serr)
		}
		if !st.CountsAt.IsZero() {
			t.Fatalf("with NoStats: counts refreshed at %v; want no refresh", st.CountsAt)
		}
		if relays != 1 {
			t.Fatalf("with NoCleaner and NoStats: %d live relay records, want 1", relays)
		}
	})
}

// RunNow runs the handler Handle registered, in the caller's transaction,
// for a due task, without Start; a topic with no handler is an error.
func TestClient_RunNowRunsTheRegisteredHandlerInTheCallersTransaction(t *testing.T) {
	b := setup(t)
	c, err := delaybridge.NewClient(b.db, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ran []string
	if err := c.Handle("expire", func(_ context.Context, _ *sql.Tx, m *delaybridge.Message) error { ran = append(ran, m.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	b.schedule(t, c, "expire", "o1")
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := c.RunNow(b.ctx, tx, "no-handler", "o1"); err == nil || !strings.Contains(err.Error(), "no handler") {
		t.Fatalf("RunNow on a topic without a handler: %v", err)
	}
	for end := time.Now().Add(5 * time.Second); !func() bool { ok, err := c.Overdue(b.ctx, tx, "expire", "o1"); return ok && err == nil }(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the task never turned overdue")
		}
	}
	if ok, err := c.RunNow(b.ctx, tx, "expire", "o1"); !ok || err != nil {
		t.Fatalf("RunNow = %v, %v; want it run", ok, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if info, err := c.Get(b.ctx, b.db, "expire", "o1"); err != nil || info.State != delaybridge.StateDone || len(ran) != 1 || ran[0] != "o1" {
		t.Fatalf("after RunNow: %+v, %v; handler ran for %v", info, err, ran)
	}
}

// Through the broker: a handler that snoozes runs again after the snooze,
// no earlier, and the task ends done with the snooze counted and no
// attempt.
func TestClient_AHandlerThatSnoozesRunsAgainAfterTheSnooze(t *testing.T) {
	b := setup(t)
	c, err := delaybridge.NewClient(b.db, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var runs []time.Time
	if err := c.Handle("pay-check", func(context.Context, *sql.Tx, *delaybridge.Message) error {
		mu.Lock()
		defer mu.Unlock()
		runs = append(runs, time.Now())
		if len(runs) == 1 {
			return delaybridge.Snooze(time.Second, "payment pending")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b.schedule(t, c, "pay-check", "o1")
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(b.ctx) //nolint:errcheck
	var info *delaybridge.TaskInfo
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if info, err = c.Get(b.ctx, b.db, "pay-check", "o1"); err == nil && info.State == delaybridge.StateDone {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the snoozed task was not done after 30 s: %+v, %v", info, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != 2 || runs[1].Sub(runs[0]) < time.Second {
		t.Fatalf("handler runs at %v: want two, the second a second or more after the first", runs)
	}
	if info.Snoozes != 1 || info.Attempts != 0 || info.Generation != 1 {
		t.Fatalf("done task: %+v; want one snooze, no attempt, generation 1", info)
	}
}
