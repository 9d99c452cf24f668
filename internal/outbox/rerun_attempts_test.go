package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// When one message of a group fails, the messages ahead of it run a
// second time (their first run was rolled back with the group): that
// second run is told so by Rerun, and only it. A message behind the
// failing one ran once, and is no rerun.
func TestHandleGroup_NeighboursThatRunAgainSeeRerun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := []string{"a", "b", "poison", "c"}
	var msgs []*broker.Message
	for _, k := range keys {
		msgs = append(msgs, b.order(t, k, time.Now().Add(-time.Millisecond)))
	}
	boom := errors.New("payment service down")
	var runs []string
	_, errs, err := outbox.HandleGroup(b.ctx, b.db, msgs, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		runs = append(runs, fmt.Sprintf("%s:%v", m.Key, m.Rerun))
		if m.Key == "poison" {
			return boom
		}
		return cancelOne(ctx, tx, m)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(errs[2], boom) || errs[0] != nil || errs[1] != nil || errs[3] != nil {
		t.Fatalf("errs = %v, want only the poison message's", errs)
	}
	if got, want := strings.Join(runs, " "), "a:false b:false poison:false a:true b:true c:false"; got != want {
		t.Fatalf("fn ran %q, want %q: a second run must carry Rerun, a first never", got, want)
	}
	for _, k := range []string{"a", "b", "c"} {
		if _, cancels := b.orderRow(t, k); cancels != 1 {
			t.Errorf("%s: %d cancels committed, want 1", k, cancels)
		}
	}
}

// A topic configured to run alone (GroupSize 1) never shares a group: when
// a message of another topic fails in a group, the alone topic's handler
// has run exactly once per message. The grouped topic's neighbours do run
// again, flagged, and the Rerun hook counts them: the burst did form a
// group with a failure in it.
func TestNewConsumer_AnAloneTopicRunsOncePerMessageWhenAGroupNeighbourFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now().Add(-time.Second)
	var reminders []*broker.Message
	for i := range 8 {
		key := "r" + strconv.Itoa(i)
		id := b.schedule(t, outbox.Task{Topic: "reminder", Key: key, DueAt: now})
		reminders = append(reminders, &broker.Message{TaskID: id, Topic: "reminder", Key: key, DeliverAt: broker.MillisUTC(now)})
	}
	var orders []*broker.Message
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		orders = append(orders, b.order(t, k, now))
	}
	poison := b.order(t, "poison", now)
	gate := &broker.Message{TaskID: b.schedule(t, outbox.Task{Topic: "gate", Key: "g", DueAt: now}), Topic: "gate", Key: "g", DeliverAt: broker.MillisUTC(now)}
	// A consumer of several topics has a spare worker too: gate2 keeps it.
	gate2 := &broker.Message{TaskID: b.schedule(t, outbox.Task{Topic: "gate2", Key: "g", DueAt: now}), Topic: "gate2", Key: "g", DeliverAt: broker.MillisUTC(now)}

	var mu sync.Mutex
	calls := map[string]int{}
	reruns := map[string]int{}
	entered, entered2, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	fn := func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		mu.Lock()
		calls[m.Topic+"/"+m.Key]++
		if m.Rerun {
			reruns[m.Topic+"/"+m.Key]++
		}
		mu.Unlock()
		switch {
		case m.Topic == "gate":
			close(entered)
			<-release
		case m.Topic == "gate2":
			close(entered2)
			<-release
		case m.Key == "poison":
			return errors.New("poison pill")
		}
		return nil
	}
	var rerunHook atomic.Int64
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	c, err := outbox.NewConsumer(b.db, mem, mem, fn, broker.ConsumerConfig{Logger: quiet(), Concurrency: 1, MaxAttempts: 1,
		Topics: map[string]broker.TopicPolicy{"reminder": {GroupSize: 1}},
		Hooks:  broker.Hooks{Rerun: func(string) { rerunHook.Add(1) }}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx, "gate", "gate2", "reminder", "order-cancel"); err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background()) //nolint:errcheck
	// The one worker waits in the gate's handler, and the spare in
	// gate2's, while the burst queues up behind them, so they find the
	// burst waiting at once: a group, the poison last, behind every other
	// message.
	if err := mem.Publish(b.ctx, gate); err != nil {
		t.Fatal(err)
	}
	<-entered
	if err := mem.Publish(b.ctx, gate2); err != nil {
		t.Fatal(err)
	}
	<-entered2
	queued := func() {
		t.Helper()
		if !testutil.Eventually(5*time.Second, 5*time.Millisecond, func() bool { return mem.Ready("reminder")+mem.Ready("order-cancel") == 0 }) {
			t.Fatal("the consumer never took the burst")
		}
		time.Sleep(100 * time.Millisecond) // the dispatchers hand the last deliveries on
	}
	if err := mem.Publish(b.ctx, append(reminders, orders...)...); err != nil {
		t.Fatal(err)
	}
	queued()
	if err := mem.Publish(b.ctx, poison); err != nil {
		t.Fatal(err)
	}
	queued()
	close(release)
	if !testutil.Eventually(30*time.Second, 20*time.Millisecond, func() bool {
		return b.count(t, "state = 'done'") == len(reminders)+len(orders)+2 && b.count(t, "state = 'dead'") == 1
	}) {
		t.Fatalf("%d tasks done, %d dead; want %d and 1", b.count(t, "state = 'done'"), b.count(t, "state = 'dead'"), len(reminders)+len(orders)+2)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range reminders {
		if n := calls["reminder/"+m.Key]; n != 1 {
			t.Errorf("reminder %s: handler ran %d times, want once: a topic that runs alone was grouped", m.Key, n)
		}
	}
	grouped := 0
	for k, n := range reruns {
		if strings.HasPrefix(k, "reminder/") {
			t.Errorf("%s ran again as a rerun", k)
		}
		grouped += n
	}
	if grouped == 0 || rerunHook.Load() != int64(grouped) {
		t.Fatalf("order-cancel reruns %v, Rerun hook %d; want the group's neighbours rerun and each counted (did the burst form no group?)", reruns, rerunHook.Load())
	}
}

// The task row's attempt count decides, not the message's: a forged
// attempt 9 for a task that never failed gets its retry (one transient
// failure must not kill it), and a forged attempt 0 for a task on its
// last attempt cannot give it ten more.
func TestNewConsumer_TheRowsAttemptsDecideNotTheMessages(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                 string
		rowAttempts, claimed int
		wantState            outbox.State
		wantAttempts         int
	}{
		{"forged attempt 9 on a fresh task", 0, 9, outbox.StatePublished, 1},
		{"forged attempt 0 on a task on its last attempt", 9, 0, outbox.StateDead, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			m := b.order(t, "forged", time.Now().Add(-time.Second))
			if _, err := b.db.Exec("UPDATE delay_task SET attempts = ?, state = 'published' WHERE id = ?", tc.rowAttempts, m.TaskID); err != nil {
				t.Fatal(err)
			}
			m.Attempt = tc.claimed
			var runs atomic.Int64
			fn := func(context.Context, *sql.Tx, *broker.Message) error {
				runs.Add(1)
				return errors.New("payment service down")
			}
			mem := memory.New(memory.Config{})
			t.Cleanup(func() { _ = mem.Close() })
			// The retry waits an hour: one run only.
			c, err := outbox.NewConsumer(b.db, mem, mem, fn, broker.ConsumerConfig{Logger: quiet(), MaxAttempts: 10,
				Backoff: broker.Backoff{Initial: time.Hour, Max: time.Hour}})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(b.ctx, "order-cancel"); err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background()) //nolint:errcheck
			if err := mem.Publish(b.ctx, m); err != nil {
				t.Fatal(err)
			}
			if !testutil.Eventually(15*time.Second, 10*time.Millisecond, func() bool {
				l := b.ledger(t, m.TaskID)
				return l.state == string(outbox.StateDead) || l.attempts != tc.rowAttempts
			}) {
				t.Fatalf("the failure was never recorded: %+v", b.ledger(t, m.TaskID))
			}
			if l := b.ledger(t, m.TaskID); l.state != string(tc.wantState) || l.attempts != tc.wantAttempts {
				t.Fatalf("row with %d attempts, message claiming %d, one failure: %+v; want %s with %d attempts",
					tc.rowAttempts, tc.claimed, l, tc.wantState, tc.wantAttempts)
			}
			if runs.Load() != 1 {
				t.Fatalf("handler ran %d times, want once", runs.Load())
			}
		})
	}
}

// HandleGroup tells the runtime each live message's attempt as its row
// counts it, whatever the message said.
func TestHandleGroup_SetsEachMessagesAttemptFromItsRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, c := b.order(t, "a", time.Now().Add(-time.Millisecond)), b.order(t, "c", time.Now().Add(-time.Millisecond))
	if _, err := b.db.Exec("UPDATE delay_task SET attempts = 4 WHERE id = ?", c.TaskID); err != nil {
		t.Fatal(err)
	}
	a.Attempt, c.Attempt = 9, 0
	if _, _, err := outbox.HandleGroup(b.ctx, b.db, []*broker.Message{a, c}, func(context.Context, *sql.Tx, *broker.Message) error {
		return errors.New("down")
	}); err != nil {
		t.Fatal(err)
	}
	if a.Attempt != 0 || c.Attempt != 4 {
		t.Fatalf("attempts after the group: a %d, c %d; want the rows' 0 and 4", a.Attempt, c.Attempt)
	}
}

// Attempts are counted one way everywhere: a task that exhausted its
// attempts shows on its row as many attempts as its last_error names and
// as its handler ran. And the dead task is recorded in the database
// alone: no copy goes to the dead topic.
func TestNewConsumer_ADeadTaskCountsEveryRunAndIsNotCopiedToTheDeadTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := b.order(t, "poison", time.Now().Add(-time.Second))
	var runs atomic.Int64
	fn := func(context.Context, *sql.Tx, *broker.Message) error {
		runs.Add(1)
		return errors.New("poison pill")
	}
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	c, err := outbox.NewConsumer(b.db, mem, mem, fn, broker.ConsumerConfig{Logger: quiet(), MaxAttempts: 4,
		Backoff: broker.Backoff{Initial: 10 * time.Millisecond, Max: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx, "order-cancel"); err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background()) //nolint:errcheck
	if err := mem.Publish(b.ctx, m); err != nil {
		t.Fatal(err)
	}
	if !testutil.Eventually(30*time.Second, 10*time.Millisecond, func() bool { return b.ledger(t, m.TaskID).state == "dead" }) {
		t.Fatalf("task never went dead: %+v", b.ledger(t, m.TaskID))
	}
	l := b.ledger(t, m.TaskID)
	if l.attempts != 4 || !strings.Contains(l.lastError, "failed 4 attempts") || runs.Load() != 4 {
		t.Fatalf("dead row: attempts %d, last_error %q, handler ran %d times; want 4, \"failed 4 attempts\", 4", l.attempts, l.lastError, runs.Load())
	}
	time.Sleep(200 * time.Millisecond) // a copy would be published right after the mark
	if n := mem.Ready(broker.DefaultDeadTopic); n != 0 {
		t.Fatalf("%d copies in %s of a task the database records dead", n, broker.DefaultDeadTopic)
	}
}

// What the database cannot record, a delivery without an envelope, still
// goes to the dead topic, its body cut to 64 KiB with its size in a header.
func TestNewConsumer_AForeignDeliveryGoesToTheDeadTopicBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	c, err := outbox.NewConsumer(b.db, mem, mem, func(context.Context, *sql.Tx, *broker.Message) error { return nil }, broker.ConsumerConfig{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx, "order-cancel"); err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background()) //nolint:errcheck
	body := []byte(strings.Repeat("x", 1<<20))
	if err := mem.PublishRaw("order-cancel", map[string]string{"content-type": "text/plain"}, body); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	ch, err := mem.Subscribe(ctx, broker.DefaultDeadTopic)
	if err != nil {
		t.Fatal(err)
	}
	var d *broker.Delivery
	select {
	case d = <-ch:
	case <-ctx.Done():
		t.Fatal("the foreign delivery never reached the dead topic")
	}
	_ = d.Acker.Ack()
	if d.Message == nil {
		t.Fatalf("dead letter undecodable: %v", d.Err)
	}
	if len(d.Message.Payload) != 64<<10 || d.Message.Headers[broker.DeadHeaderTruncated] != strconv.Itoa(len(body)) {
		t.Fatalf("dead letter of a 1 MiB body: %d bytes, %s=%q; want 64 KiB and the original size",
			len(d.Message.Payload), broker.DeadHeaderTruncated, d.Message.Headers[broker.DeadHeaderTruncated])
	}
}
