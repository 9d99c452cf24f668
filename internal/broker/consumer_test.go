package broker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// bundle is what a consumer test needs.
type bundle struct {
	b     *memory.Broker
	topic string
	dead  *deadBox
}

type deadBox struct {
	mu      sync.Mutex
	reasons map[string]error
}

func (d *deadBox) Dead(_ context.Context, dl *broker.Delivery, reason error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	key := "malformed"
	if dl.Message != nil {
		key = dl.Message.Key
	}
	d.reasons[key] = reason
	return nil
}

func (d *deadBox) get(key string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reasons[key]
}

func setup(t *testing.T, cfg memory.Config) *bundle {
	t.Helper()
	b := memory.New(cfg)
	t.Cleanup(func() { _ = b.Close() })
	return &bundle{b: b, topic: "orders", dead: &deadBox{reasons: map[string]error{}}}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func (bd *bundle) start(t *testing.T, h broker.Handler, cfg broker.ConsumerConfig) *broker.Consumer {
	t.Helper()
	return bd.startOn(t, bd.b, h, cfg)
}

func (bd *bundle) publish(t *testing.T, key string, due time.Time) {
	t.Helper()
	m := &broker.Message{Topic: bd.topic, Key: key, DeliverAt: broker.MillisUTC(due)}
	if err := bd.b.Publish(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !testutil.Eventually(10*time.Second, 10*time.Millisecond, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestConsumer_AcksOnlyAfterHandlerReturns(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	started, release := make(chan struct{}), make(chan struct{})
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		close(started)
		<-release
		return nil
	}, broker.ConsumerConfig{})
	bd.publish(t, "k", time.Now())
	<-started
	time.Sleep(50 * time.Millisecond)
	if s := bd.b.Stats(); s.Acked != 0 {
		t.Fatalf("acked %d while the handler was still running", s.Acked)
	}
	close(release)
	eventually(t, "the ack", func() bool { return bd.b.Stats().Acked == 1 })
}

func TestConsumer_PanicIsRetriedAsAnError(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	var mu sync.Mutex
	var attempts []int
	retried := 0
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, m.Attempt)
		if m.Attempt == 0 {
			panic("nil map")
		}
		return nil
	}, broker.ConsumerConfig{
		Backoff: broker.Backoff{Initial: 20 * time.Millisecond},
		Hooks:   broker.Hooks{Retried: func(string, int) { mu.Lock(); retried++; mu.Unlock() }},
	})
	bd.publish(t, "k", time.Now())
	eventually(t, "the retry to succeed", func() bool { mu.Lock(); defer mu.Unlock(); return len(attempts) == 2 })
	mu.Lock()
	defer mu.Unlock()
	if attempts[0] != 0 || attempts[1] != 1 || retried != 1 {
		t.Fatalf("attempts %v, retried hook %d; want [0 1] and 1", attempts, retried)
	}
}

func TestConsumer_HandlerTimeoutCountsAsFailure(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		<-ctx.Done()
		return ctx.Err()
	}, broker.ConsumerConfig{HandlerTimeout: 50 * time.Millisecond, MaxAttempts: 1})
	bd.publish(t, "hangs", time.Now())
	eventually(t, "dead", func() bool { return bd.dead.get("hangs") != nil })
	if err := bd.dead.get("hangs"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dead reason %v, want the handler's deadline", err)
	}
}

func TestConsumer_DueBeyondMaxDelayGoesDead(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		t.Errorf("handler ran for %s", m.Key)
		return nil
	}, broker.ConsumerConfig{})
	far := &broker.Message{Topic: bd.topic, Key: "year-9999", DeliverAt: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)}
	if err := bd.b.PublishRaw(bd.topic, broker.Encode(far), nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "dead", func() bool { return bd.dead.get("year-9999") != nil })
	if err := bd.dead.get("year-9999"); !errors.Is(err, broker.ErrTooFar) {
		t.Fatalf("dead reason %v, want ErrTooFar", err)
	}
}

func TestConsumer_HeldEarlyMessageDoesNotBlockDueOnes(t *testing.T) {
	t.Parallel()
	// The broker lets every hop out 2.8 s early; one worker only.
	bd := setup(t, memory.Config{Limits: broker.Limits{Precision: 3 * time.Second}, Early: 2800 * time.Millisecond})
	var mu sync.Mutex
	handled := map[string]time.Time{}
	var order []string
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		handled[m.Key] = time.Now()
		order = append(order, m.Key)
		return nil
	}, broker.ConsumerConfig{Concurrency: 1})
	// Due in 3 s: the second publish below may be held up for seconds on
	// a loaded box and still comes before it.
	earlyDue := time.Now().Add(3 * time.Second)
	bd.publish(t, "early", earlyDue)
	time.Sleep(400 * time.Millisecond) // "early" is now held in memory
	bd.publish(t, "due-now", time.Now())
	eventually(t, "both", func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) == 2 })
	mu.Lock()
	defer mu.Unlock()
	if order[0] != "due-now" {
		t.Fatalf("handled in order %v: the held message blocked the only worker", order)
	}
	if handled["early"].Before(broker.MillisUTC(earlyDue)) {
		t.Fatalf("held message handled %v early", broker.MillisUTC(earlyDue).Sub(handled["early"]))
	}
}

func TestConsumer_NeverRunsAMessageEarlyWhenTheClockStepsBack(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	// The consumer's wall clock steps back 300ms (an NTP correction) right
	// after the message was dispatched as due: the worker then finds it
	// early, inside the hold window, and must wait it out before running it.
	var calls atomic.Int64
	now := func() time.Time {
		if calls.Add(1) == 1 {
			return time.Now()
		}
		return time.Now().Add(-300 * time.Millisecond)
	}
	ran := make(chan time.Duration, 1)
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		ran <- now().Sub(m.DeliverAt)
		return nil
	}, broker.ConsumerConfig{Now: now})
	bd.publish(t, "k", time.Now())
	select {
	case late := <-ran:
		if late < 0 {
			t.Fatalf("handled %v before its due time by the consumer's clock", -late)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("never handled")
	}
}

func TestConsumer_DefaultDeadLetterPublishesToDeadTopic(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	c, err := broker.NewConsumer(bd.b, bd.b, func(context.Context, *broker.Message) error { return nil }, broker.ConsumerConfig{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), bd.topic); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(context.Background()) }()
	if err := bd.b.PublishRaw(bd.topic, map[string]string{"foreign": "header"}, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := bd.b.Subscribe(ctx, broker.DefaultDeadTopic)
	if err != nil {
		t.Fatal(err)
	}
	d := <-ch
	if d == nil || d.Err != nil {
		t.Fatalf("dead topic delivery: %+v", d)
	}
	m := d.Message
	if string(m.Payload) != "garbage" || m.Headers["dead-orig-foreign"] != "header" || !strings.Contains(m.Headers[broker.DeadHeaderReason], "no delaybridge envelope") {
		t.Fatalf("dead message lost the original: %+v", m)
	}
	_ = d.Acker.Ack()
}

func TestConsumer_CloseGivesBackAHeldMessageAndLeavesNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	// Every hop arrives a minute early, inside the hold window (twice the
	// precision), so the consumer holds it in memory on a timer.
	b := memory.New(memory.Config{Limits: broker.Limits{Precision: time.Minute}, Early: time.Minute})
	handled := make(chan string, 2)
	c, err := broker.NewConsumer(b, b, func(_ context.Context, m *broker.Message) error {
		handled <- m.Key
		return nil
	}, broker.ConsumerConfig{Logger: quiet(), Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), "a", "b"); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(context.Background(), &broker.Message{Topic: "a", Key: "held", DeliverAt: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	// One topic's deliveries are dispatched in order, and the only worker
	// is free only if the early one was parked on a timer rather than
	// waited out by the worker: once the due message behind it reached the
	// handler, the early one is held.
	if err := b.Publish(context.Background(), &broker.Message{Topic: "a", Key: "due", DeliverAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	select {
	case key := <-handled:
		if key != "due" {
			t.Fatalf("handled %q first, want the due message", key)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the due message never ran: the early one was not held but took the only worker")
	}
	eventually(t, "the due message acked", func() bool { return b.Stats().Acked == 1 })
	if s := b.Stats(); s.Delivered != 2 {
		t.Fatalf("stats %+v, want both messages delivered", s)
	}
	// Close must stop the held message's timer and give the delivery back
	// rather than wait out its minute.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case key := <-handled:
		t.Fatalf("handled %q after Close", key)
	default:
	}
	if s, ready := b.Stats(), b.Ready("a"); s.Acked != 1 || ready != 1 {
		t.Fatalf("after Close: stats %+v, %d ready on a; want the held message given back, unacked", s, ready)
	}
	if err := c.Start(context.Background(), "a"); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Start after Close = %v, want ErrClosed", err)
	}
	_ = b.Close()
}

func TestNewConsumer_RejectsBadArguments(t *testing.T) {
	t.Parallel()
	b := memory.New(memory.Config{})
	h := func(context.Context, *broker.Message) error { return nil }
	if _, err := broker.NewConsumer(nil, b, h, broker.ConsumerConfig{}); err == nil {
		t.Error("nil subscriber accepted")
	}
	if _, err := broker.NewConsumer(b, b, nil, broker.ConsumerConfig{}); err == nil {
		t.Error("nil handler accepted")
	}
	bad := memory.New(memory.Config{Limits: broker.Limits{Levels: []time.Duration{time.Second, time.Millisecond}}})
	if _, err := broker.NewConsumer(bad, bad, h, broker.ConsumerConfig{}); err == nil {
		t.Error("descending levels accepted")
	}
	c, err := broker.NewConsumer(b, b, h, broker.ConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), "bad.topic"); !errors.Is(err, broker.ErrInvalidTopic) {
		t.Errorf("Start(bad.topic) = %v, want ErrInvalidTopic", err)
	}
}

func TestConsumer_StuckHandlerIsAbandonedRetriedThenDeadAndTheWorkerFreed(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	release := make(chan struct{})
	var mu sync.Mutex
	var handled []string
	stuckHooks := 0
	c := bd.start(t, func(ctx context.Context, m *broker.Message) error {
		if m.Key == "hangs" {
			<-release // ignores ctx, as a handler stuck in a call without a deadline would
			return nil
		}
		mu.Lock()
		handled = append(handled, m.Key)
		mu.Unlock()
		return nil
	}, broker.ConsumerConfig{
		Concurrency:    1, // one stuck handler would block everything behind it
		HandlerTimeout: 50 * time.Millisecond,
		HandlerGrace:   50 * time.Millisecond,
		MaxAttempts:    2,
		Backoff:        broker.Backoff{Initial: 20 * time.Millisecond},
		Hooks:          broker.Hooks{Stuck: func(string) { mu.Lock(); stuckHooks++; mu.Unlock() }},
	})
	// Released before the consumer's cleanup closes it (cleanups run last first).
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	bd.publish(t, "hangs", time.Now())
	bd.publish(t, "after", time.Now())
	eventually(t, "the stuck message dead", func() bool { return bd.dead.get("hangs") != nil })
	eventually(t, "the message behind it handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) == 1 })
	if err := bd.dead.get("hangs"); !errors.Is(err, broker.ErrHandlerStuck) || !strings.Contains(err.Error(), "failed 2 attempts") {
		t.Fatalf("dead reason %v, want ErrHandlerStuck after 2 attempts", err)
	}
	mu.Lock()
	hooks := stuckHooks
	mu.Unlock()
	if got := c.Stuck(); got != 2 || hooks != 2 {
		t.Fatalf("Stuck() = %d, hook called %d times; want 2 abandoned handlers still running", got, hooks)
	}
	close(release)
	eventually(t, "the abandoned handlers to return", func() bool { return c.Stuck() == 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close after the stuck handlers returned: %v", err)
	}
}

func TestConsumer_CloseReportsAStuckHandlerStillRunning(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	// The memory broker refuses a settle once Close ended the subscription;
	// counting the runtime's calls shows what it tried.
	sub := &countingSub{Subscriber: bd.b}
	release, started := make(chan struct{}), make(chan struct{})
	c := bd.startOn(t, sub, func(ctx context.Context, m *broker.Message) error {
		close(started)
		<-release
		return nil
	}, broker.ConsumerConfig{
		HandlerTimeout: time.Hour,
		// The runtime abandons the handler, and settles its delivery,
		// HandlerGrace after Close gave up: keep that short to see it.
		HandlerGrace: 50 * time.Millisecond,
		// On its last attempt, so counting it as a failure would dead-letter
		// and ack it.
		MaxAttempts: 1,
	})
	t.Cleanup(func() { close(release) })
	bd.publish(t, "k", time.Now())
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a handler ignoring its context = %v, want the deadline", err)
	}
	eventually(t, "the abandoned handler's delivery settled", func() bool { return sub.acks.Load()+sub.nacks.Load() > 0 })
	if acks, nacks := sub.acks.Load(), sub.nacks.Load(); acks != 0 || nacks != 1 || bd.dead.get("k") != nil {
		t.Fatalf("Ack called %d times, Nack %d, dead %v for a message whose handler never returned; want it given back once", acks, nacks, bd.dead.get("k"))
	}
	if s := bd.b.Stats(); s.Acked != 0 {
		t.Fatalf("acked %d messages whose handler never returned", s.Acked)
	}
	if got := c.Stuck(); got != 1 {
		t.Fatalf("Stuck() = %d, want the abandoned handler counted", got)
	}
}

func TestConsumer_AlwaysPanickingHandlerGoesDeadAndOthersRun(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	var mu sync.Mutex
	runs := map[string]int{}
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		runs[m.Key]++
		mu.Unlock()
		if m.Key == "panics" {
			panic("assignment to entry in nil map")
		}
		return nil
	}, broker.ConsumerConfig{Concurrency: 1, MaxAttempts: 3, Backoff: broker.Backoff{Initial: 10 * time.Millisecond}})
	bd.publish(t, "panics", time.Now())
	bd.publish(t, "after", time.Now())
	eventually(t, "the panicking message dead", func() bool { return bd.dead.get("panics") != nil })
	eventually(t, "the message behind it handled", func() bool { mu.Lock(); defer mu.Unlock(); return runs["after"] == 1 })
	mu.Lock()
	defer mu.Unlock()
	if runs["panics"] != 3 {
		t.Fatalf("the panicking handler ran %d times, want 3 (MaxAttempts)", runs["panics"])
	}
	if err := bd.dead.get("panics"); err == nil || !strings.Contains(err.Error(), "handler panicked") || !strings.Contains(err.Error(), "nil map") {
		t.Fatalf("dead reason %v does not say the handler panicked and why", err)
	}
}

func TestConsumer_GroupTakesEveryDueMessageWaiting(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var sizes []int
	handled := 0
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		once.Do(func() { close(started); <-release })
		mu.Lock()
		handled++
		mu.Unlock()
		return nil
	}, broker.ConsumerConfig{Concurrency: 1, Group: func(ctx context.Context, msgs []*broker.Message) ([]error, error) {
		mu.Lock()
		sizes = append(sizes, len(msgs))
		handled += len(msgs)
		mu.Unlock()
		return make([]error, len(msgs)), nil
	}})
	// The only worker is busy with the first message while 30 more arrive.
	bd.publish(t, "first", time.Now())
	<-started
	for i := range 30 {
		bd.publish(t, "k"+string(rune('a'+i)), time.Now())
	}
	// The broker has handed all 31 to the subscription, then a moment for
	// the subscription's hand-over to the consumer's queue (a loaded box
	// can take far longer than a sleep allows over the whole way).
	eventually(t, "all 31 delivered", func() bool { return bd.b.Stats().Delivered >= 31 })
	time.Sleep(200 * time.Millisecond)
	close(release)
	eventually(t, "all 31 handled", func() bool { mu.Lock(); defer mu.Unlock(); return handled == 31 })
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) == 0 || sizes[0] != 30 {
		t.Fatalf("group sizes %v: want the 30 waiting messages in one group", sizes)
	}
}

// Messages held until the same due time go to the handler in the order
// they arrived, so a broker that pays for an ack by the unacked
// deliveries ahead of it (RabbitMQ) is acked in order after a burst.
func TestConsumer_HeldMessagesDueTogetherRunInArrivalOrder(t *testing.T) {
	t.Parallel()
	// An Early longer than the delay hands every message over at once, in
	// the order published: they arrive a second early and are held.
	bd := setup(t, memory.Config{Limits: broker.Limits{Precision: 2 * time.Second}, Early: 2 * time.Second, Prefetch: 1000})
	const n = 300
	var mu sync.Mutex
	var order []string
	done := make(chan struct{})
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, m.Key)
		if len(order) == n {
			close(done)
		}
		return nil
	}, broker.ConsumerConfig{Concurrency: 1})
	due := time.Now().Add(time.Second)
	for i := range n {
		bd.publish(t, fmt.Sprintf("k%03d", i), due)
	}
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("not every message was handled")
	}
	mu.Lock()
	defer mu.Unlock()
	for i, k := range order {
		if want := fmt.Sprintf("k%03d", i); k != want {
			t.Fatalf("message %d handled was %s, want %s: held messages due together ran out of arrival order", i, k, want)
		}
	}
}

// Without a Concurrency, a consumer runs two handlers a core (GOMAXPROCS),
// at least 4 and at most DefaultConcurrency, and never more at once.
func TestConsumer_DefaultConcurrencyFollowsTheCores(t *testing.T) {
	// Not parallel: it sets GOMAXPROCS for the whole test binary.
	was := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(was) })
	for _, c := range []struct{ procs, want int }{{1, 4}, {2, 4}, {3, 6}, {4, 8}, {16, 8}} {
		if got := broker.DefaultConcurrencyFor(c.procs); got != c.want {
			t.Errorf("DefaultConcurrencyFor(%d) = %d, want %d", c.procs, got, c.want)
		}
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", c.procs), func(t *testing.T) {
			runtime.GOMAXPROCS(c.procs)
			bd := setup(t, memory.Config{})
			release := make(chan struct{})
			var mu sync.Mutex
			running, most := 0, 0
			bd.start(t, func(ctx context.Context, m *broker.Message) error {
				mu.Lock()
				running++
				most = max(most, running)
				mu.Unlock()
				<-release
				mu.Lock()
				running--
				mu.Unlock()
				return nil
			}, broker.ConsumerConfig{})
			runtime.GOMAXPROCS(was) // the consumer took its default at NewConsumer
			for i := range 2 * broker.DefaultConcurrency {
				bd.publish(t, fmt.Sprintf("k%d", i), time.Now())
			}
			eventually(t, fmt.Sprintf("%d handlers running", c.want), func() bool { mu.Lock(); defer mu.Unlock(); return running == c.want })
			// Every other message is waiting: an idle worker would take one now.
			time.Sleep(200 * time.Millisecond)
			mu.Lock()
			got := most
			mu.Unlock()
			close(release)
			if got != c.want {
				t.Fatalf("at most %d handlers ran at once, want %d", got, c.want)
			}
			eventually(t, "every message acked", func() bool { return bd.b.Stats().Acked == 2*broker.DefaultConcurrency })
		})
	}
}

// givenBackSub delivers the deliveries put in its channel.
type givenBackSub struct{ ch chan *broker.Delivery }

func (s givenBackSub) Subscribe(context.Context, string) (<-chan *broker.Delivery, error) {
	return s.ch, nil
}

// records keeps the level and message of every log record.
type records struct {
	mu   sync.Mutex
	list []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, rec)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// A message handled while Close ends the subscription cannot be acked: the
// subscription gave it back and the broker redelivers it, which the done
// task makes harmless. That is part of a shutdown under load, so it is
// logged as information, not as a warning an operator must look into;
// any other ack failure stays a warning.
func TestConsumer_AnAckAfterTheSubscriptionGaveItBackIsNotAWarning(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want slog.Level
	}{
		{"given back", fmt.Errorf("rocket: delivery already given back, the subscription ended: %w", broker.ErrClosed), slog.LevelInfo},
		{"other failure", errors.New("channel broken"), slog.LevelWarn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub := givenBackSub{ch: make(chan *broker.Delivery, 1)}
			var acks atomic.Int32
			acker := failingAcker{acks: &acks, err: tc.err}
			log := &records{}
			pub := memory.New(memory.Config{})
			t.Cleanup(func() { _ = pub.Close() })
			c, err := broker.NewConsumer(sub, pub, func(context.Context, *broker.Message) error { return nil },
				broker.ConsumerConfig{Logger: slog.New(log), DeadLetter: &deadBox{reasons: map[string]error{}}})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(context.Background(), "orders"); err != nil {
				t.Fatal(err)
			}
			sub.ch <- &broker.Delivery{Message: &broker.Message{Topic: "orders", Key: "o-1", DeliverAt: broker.MillisUTC(time.Now())}, Acker: acker}
			eventually(t, "the ack", func() bool { return acks.Load() == 1 })
			close(sub.ch)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := c.Close(ctx); err != nil {
				t.Fatal(err)
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			var ackLogs []string
			for _, r := range log.list {
				if strings.Contains(r.Message, "redeliver") {
					ackLogs = append(ackLogs, r.Level.String()+" "+r.Message)
					if r.Level != tc.want {
						t.Errorf("logged %s %q, want level %s", r.Level, r.Message, tc.want)
					}
				}
			}
			if len(ackLogs) != 1 {
				t.Errorf("ack logs %q, want exactly one", ackLogs)
			}
		})
	}
}

// failingAcker fails every Ack and Nack with err.
type failingAcker struct {
	acks *atomic.Int32
	err  error
}

func (a failingAcker) Ack() error  { a.acks.Add(1); return a.err }
func (a failingAcker) Nack() error { return a.err }

// A negative setting, or a backoff that cannot mean what was meant, is
// refused by NewConsumer (and ConsumerConfig.Check) with every problem
// named, not replaced by a default.
func TestNewConsumer_RefusesNegativeSettingsAndABackoffThatCannotWork(t *testing.T) {
	t.Parallel()
	b := memory.New(memory.Config{})
	t.Cleanup(func() { _ = b.Close() })
	h := func(context.Context, *broker.Message) error { return nil }
	for _, c := range []struct {
		cfg  broker.ConsumerConfig
		want string
	}{
		{broker.ConsumerConfig{MaxAttempts: -1}, "MaxAttempts -1 is negative"},
		{broker.ConsumerConfig{Concurrency: -2, GroupSize: -3}, "Concurrency -2 is negative; GroupSize -3 is negative"},
		{broker.ConsumerConfig{HandlerTimeout: -time.Second}, "HandlerTimeout -1s is negative"},
		{broker.ConsumerConfig{Backoff: broker.Backoff{Jitter: 2}}, "Backoff.Jitter 2"},
		{broker.ConsumerConfig{Backoff: broker.Backoff{Multiplier: 0.5}}, "Backoff.Multiplier 0.5 would shrink"},
		{broker.ConsumerConfig{Backoff: broker.Backoff{Initial: time.Minute, Max: time.Second}}, "Backoff.Max 1s is below Backoff.Initial 1m0s"},
	} {
		if _, err := broker.NewConsumer(b, b, h, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewConsumer(%+v) = %v, want %q", c.cfg, err, c.want)
		}
		if err := c.cfg.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
	if err := (broker.ConsumerConfig{}).Check(); err != nil {
		t.Errorf("the zero ConsumerConfig: Check = %v, want nil (every default)", err)
	}
}

// A delivery that is not ready (here one that could not be decoded, whose
// dead letter waits on the broker) does not hold up the due messages a
// worker is gathering into a group: the group runs first, then the
// delivery is settled. Handled inline, the group waited for the dead
// letter.
func TestConsumer_NotReadyDeliveryDoesNotHoldUpTheGroup(t *testing.T) {
	sub := givenBackSub{ch: make(chan *broker.Delivery, 8)}
	pub := memory.New(memory.Config{})
	t.Cleanup(func() { _ = pub.Close() })
	started, release := make(chan struct{}), make(chan struct{})
	deadStarted, deadRelease := make(chan struct{}), make(chan struct{})
	type group struct {
		keys       []string
		deadBefore bool // the dead letter had started when the group ran
	}
	grouped := make(chan group, 4)
	var once sync.Once
	c, err := broker.NewConsumer(sub, pub, func(context.Context, *broker.Message) error {
		once.Do(func() { close(started); <-release })
		return nil
	}, broker.ConsumerConfig{
		Logger: quiet(), Concurrency: 1,
		Group: func(_ context.Context, msgs []*broker.Message) ([]error, error) {
			var keys []string
			for _, m := range msgs {
				keys = append(keys, m.Key)
			}
			g := group{keys: keys}
			select {
			case <-deadStarted:
				g.deadBefore = true
			default:
			}
			grouped <- g
			return make([]error, len(msgs)), nil
		},
		DeadLetter: broker.DeadLetterFunc(func(context.Context, *broker.Delivery, error) error {
			close(deadStarted)
			<-deadRelease
			return nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	var acks atomic.Int32
	due := func(key string) *broker.Delivery {
		return &broker.Delivery{Message: &broker.Message{Topic: "orders", Key: key, DeliverAt: broker.MillisUTC(time.Now())}, Acker: failingAcker{acks: &acks}}
	}
	// The only worker is busy with the first message while a due one, an
	// undecodable one and another due one queue up behind it.
	sub.ch <- due("first")
	<-started
	sub.ch <- due("a")
	sub.ch <- &broker.Delivery{Err: broker.ErrNoEnvelope, Body: []byte("junk"), Acker: failingAcker{acks: &acks}}
	sub.ch <- due("b")
	time.Sleep(200 * time.Millisecond) // the subscription's hand-over to the worker's queue
	close(release)
	select {
	case <-deadStarted:
		// Handled inline, the dead letter blocks the worker: let it go,
		// so the group shows what it waited for.
		close(deadRelease)
	case g := <-grouped:
		grouped <- g
		select {
		case <-deadStarted:
		case <-time.After(10 * time.Second):
			t.Fatal("the undecodable delivery was never dead-lettered")
		}
		close(deadRelease)
	case <-time.After(10 * time.Second):
		t.Fatal("neither a group nor a dead letter")
	}
	select {
	case g := <-grouped:
		if strings.Join(g.keys, ",") != "a,b" {
			t.Errorf("group %v, want a and b", g.keys)
		}
		if g.deadBefore {
			t.Error("the undecodable delivery's dead letter ran before the group of due messages")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no group")
	}
	eventually(t, "all four acked", func() bool { return acks.Load() == 4 })
}

// A message its group left out (ErrHandleAlone: outbox.HandleGroup found
// its task row held by another transaction) runs through the Handler on
// its own after the group, and is neither retried nor counted an attempt.
func TestConsumer_AMessageLeftOutOfItsGroupRunsAlone(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var alone, grouped []string
	var retries atomic.Int32
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		once.Do(func() { close(started); <-release })
		mu.Lock()
		alone = append(alone, m.Key)
		mu.Unlock()
		return nil
	}, broker.ConsumerConfig{Concurrency: 1,
		Hooks: broker.Hooks{Retried: func(string, int) { retries.Add(1) }},
		Group: func(ctx context.Context, msgs []*broker.Message) ([]error, error) {
			errs := make([]error, len(msgs))
			mu.Lock()
			defer mu.Unlock()
			for i, m := range msgs {
				if m.Key == "held" {
					errs[i] = fmt.Errorf("task 7: %w", broker.ErrHandleAlone)
					continue
				}
				grouped = append(grouped, m.Key)
			}
			return errs, nil
		}})
	// The only worker is busy with the first message while three more
	// arrive: they make one group.
	bd.publish(t, "first", time.Now())
	<-started
	for _, k := range []string{"a", "held", "b"} {
		bd.publish(t, k, time.Now())
	}
	eventually(t, "all 4 delivered", func() bool { return bd.b.Stats().Delivered >= 4 })
	time.Sleep(200 * time.Millisecond) // the subscription's hand-over to the worker's queue
	close(release)
	eventually(t, "all 4 acked", func() bool { return bd.b.Stats().Acked == 4 })
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(grouped, ",") != "a,b" || strings.Join(alone, ",") != "first,held" {
		t.Fatalf("grouped %v, alone %v: want a and b in the group, held run alone after it", grouped, alone)
	}
	if n := retries.Load(); n != 0 {
		t.Fatalf("%d retries: a message left out of its group is no failure", n)
	}
}

// A handler whose database is out (ErrUnavailable) has its message given
// back and run again, counting no attempt: with one attempt allowed it
// would otherwise go to dead on the first failure.
func TestConsumer_AnUnavailableDatabaseCountsNoAttempt(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	var runs, retries atomic.Int32
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		if runs.Add(1) <= 2 {
			return fmt.Errorf("outbox: handle: begin: %w: connection refused", broker.ErrUnavailable)
		}
		return nil
	}, broker.ConsumerConfig{MaxAttempts: 1, DeadLetter: bd.dead,
		Hooks: broker.Hooks{Retried: func(string, int) { retries.Add(1) }}})
	bd.publish(t, "k", time.Now())
	eventually(t, "the message handled", func() bool { return bd.b.Stats().Acked == 1 })
	if err := bd.dead.get("k"); err != nil {
		t.Fatalf("sent to dead (%v): an unavailable database is no failed attempt", err)
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("%d runs, want 3 (two while the database was out)", n)
	}
	if n := retries.Load(); n != 0 {
		t.Fatalf("%d retries published: want the message given back, no attempt spent", n)
	}
}

// A group whose transaction could not begin for an unavailable database is
// given back whole after one pause, not run one message at a time (each
// would wait for the database in turn) nor counted an attempt.
func TestConsumer_AGroupWhoseDatabaseIsOutIsGivenBackWhole(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var groups atomic.Int32
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		once.Do(func() { close(started); <-release })
		return nil
	}, broker.ConsumerConfig{Concurrency: 1, MaxAttempts: 1, DeadLetter: bd.dead,
		Group: func(ctx context.Context, msgs []*broker.Message) ([]error, error) {
			if groups.Add(1) == 1 {
				return nil, fmt.Errorf("outbox: handle group: begin: %w: connection refused", broker.ErrUnavailable)
			}
			return make([]error, len(msgs)), nil
		}})
	bd.publish(t, "first", time.Now())
	<-started
	for _, k := range []string{"a", "b", "c"} {
		bd.publish(t, k, time.Now())
	}
	eventually(t, "all 4 delivered", func() bool { return bd.b.Stats().Delivered >= 4 })
	time.Sleep(200 * time.Millisecond) // the subscription's hand-over to the worker's queue
	close(release)
	eventually(t, "all 4 acked", func() bool { return bd.b.Stats().Acked == 4 })
	for _, k := range []string{"a", "b", "c"} {
		if err := bd.dead.get(k); err != nil {
			t.Errorf("%s sent to dead: %v", k, err)
		}
	}
	if n := bd.b.Stats().Nacked; n != 3 {
		t.Fatalf("%d nacks, want the group's 3 given back (run one at a time instead, they give none)", n)
	}
}

// keyedAcker reports each settle call with the delivery's key.
type keyedAcker struct {
	key     string
	settled chan<- string
}

func (a keyedAcker) Ack() error  { a.settled <- a.key + ":ack"; return nil }
func (a keyedAcker) Nack() error { a.settled <- a.key + ":nack"; return nil }

// A group interrupted by a forced shutdown (Close gave up waiting) is given
// back whole: each of its deliveries is nacked once, and none of them is
// run again one at a time by a consumer that is shutting down.
func TestConsumer_ForcedShutdownGivesBackAWholeGroup(t *testing.T) {
	t.Parallel()
	sub := givenBackSub{ch: make(chan *broker.Delivery, 8)}
	pub := memory.New(memory.Config{})
	t.Cleanup(func() { _ = pub.Close() })
	gateIn, gate := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	alone := map[string]int{} // keys the one-at-a-time handler ran
	grouped := make(chan []string, 4)
	c, err := broker.NewConsumer(sub, pub, func(ctx context.Context, m *broker.Message) error {
		if m.Key == "gate" {
			close(gateIn)
			<-gate
			return nil
		}
		mu.Lock()
		alone[m.Key]++
		mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}, broker.ConsumerConfig{Logger: quiet(), Concurrency: 1, Group: func(ctx context.Context, msgs []*broker.Message) ([]error, error) {
		keys := make([]string, len(msgs))
		for i, m := range msgs {
			keys[i] = m.Key
		}
		grouped <- keys
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
	settled := make(chan string, 16)
	deliver := func(key string) {
		sub.ch <- &broker.Delivery{Message: &broker.Message{Topic: "orders", Key: key, DeliverAt: broker.MillisUTC(time.Now())},
			Acker: keyedAcker{key: key, settled: settled}}
	}
	// The only worker runs the gate while the others queue up behind it,
	// so it takes them as one group once the gate opens.
	deliver("gate")
	<-gateIn
	for _, k := range []string{"a", "b", "c"} {
		deliver(k)
	}
	eventually(t, "the deliveries queued", func() bool { return len(sub.ch) == 0 })
	time.Sleep(50 * time.Millisecond) // the dispatcher hands the last one on
	close(gate)
	var group []string
	select {
	case group = <-grouped:
	case <-time.After(10 * time.Second):
		t.Fatal("the queued deliveries never reached the group handler")
	}
	if got := <-settled; got != "gate:ack" {
		t.Fatalf("the gate was settled with %s, want gate:ack", got)
	}
	close(sub.ch)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a group running = %v, want the deadline", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := c.Close(ctx2); err != nil {
		t.Fatalf("Close after the group returned: %v", err)
	}
	got := map[string]int{}
	for len(settled) > 0 {
		got[<-settled]++
	}
	mu.Lock()
	defer mu.Unlock()
	for _, k := range group {
		if got[k+":nack"] != 1 || got[k+":ack"] != 0 {
			t.Errorf("%s of the interrupted group %v settled %v, want one nack", k, group, got)
		}
		if alone[k] != 0 {
			t.Errorf("%s of the interrupted group %v ran alone after the forced shutdown (%v)", k, group, alone)
		}
	}
}

// A delivery that reaches the consumer a little early after Close began is
// given back at once, not held in memory: the goroutine that gives back
// held messages has stopped, so one held now would never be settled.
func TestConsumer_EarlyDeliveryDuringCloseIsGivenBackNotHeld(t *testing.T) {
	t.Parallel()
	sub := givenBackSub{ch: make(chan *broker.Delivery, 1)}
	pub := memory.New(memory.Config{})
	t.Cleanup(func() { _ = pub.Close() })
	ran := make(chan string, 1)
	c, err := broker.NewConsumer(sub, pub, func(_ context.Context, m *broker.Message) error {
		ran <- m.Key
		return nil
	}, broker.ConsumerConfig{Logger: quiet(), Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// givenBackSub's channel stays open through Close, as a subscription
	// still handing over what it had buffered would.
	go func() { closed <- c.Close(ctx) }()
	eventually(t, "Close to begin", func() bool { return errors.Is(c.Start(context.Background(), "orders"), broker.ErrClosed) })
	time.Sleep(50 * time.Millisecond) // the held messages' goroutine gives back what it held and ends
	settled := make(chan string, 2)
	// Due in 2 s: inside the hold window (DefaultHoldWindow).
	sub.ch <- &broker.Delivery{Message: &broker.Message{Topic: "orders", Key: "early", DeliverAt: broker.MillisUTC(time.Now().Add(2 * time.Second))},
		Acker: keyedAcker{key: "early", settled: settled}}
	close(sub.ch)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case got := <-settled:
		if got != "early:nack" {
			t.Fatalf("the early delivery was settled with %s, want early:nack", got)
		}
	default:
		t.Fatal("Close returned and the early delivery was never settled: held after the consumer closed")
	}
	select {
	case k := <-ran:
		t.Fatalf("handled %q during Close", k)
	default:
	}
}

// topicSub hands each topic its own channel.
type topicSub map[string]chan *broker.Delivery

func (s topicSub) Subscribe(_ context.Context, topic string) (<-chan *broker.Delivery, error) {
	return s[topic], nil
}

// A group holds the messages of one topic, and Hooks.Grouped tells that
// topic how many of them the transaction committed; a group that failed
// whole committed nothing and is not reported.
func TestConsumer_GroupedReportsTheTopicOfACommittedGroup(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		sub := topicSub{"a": make(chan *broker.Delivery, 8), "b": make(chan *broker.Delivery, 8)}
		pub := memory.New(memory.Config{})
		t.Cleanup(func() { _ = pub.Close() })
		gateIn, gate := make(chan struct{}), make(chan struct{})
		var mu sync.Mutex
		inGroups := map[string]int{} // topic → messages the group handler got
		reported := map[string]int{} // topic → what Grouped said
		groups, mixed := 0, false
		c, err := broker.NewConsumer(sub, pub, func(ctx context.Context, m *broker.Message) error {
			if m.Key == "gate" {
				close(gateIn)
				<-gate
			}
			return nil
		}, broker.ConsumerConfig{Logger: quiet(), Concurrency: 1,
			Group: func(_ context.Context, msgs []*broker.Message) ([]error, error) {
				mu.Lock()
				defer mu.Unlock()
				groups++
				for _, m := range msgs {
					inGroups[m.Topic]++
					mixed = mixed || m.Topic != msgs[0].Topic
				}
				if fail {
					return nil, errors.New("the group's transaction failed")
				}
				return make([]error, len(msgs)), nil
			},
			Hooks: broker.Hooks{Grouped: func(topic string, n int, _ time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				reported[topic] += n
			}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background(), "a", "b"); err != nil {
			t.Fatal(err)
		}
		settled := make(chan string, 16)
		deliver := func(topic, key string) {
			sub[topic] <- &broker.Delivery{Message: &broker.Message{Topic: topic, Key: key, DeliverAt: broker.MillisUTC(time.Now())},
				Acker: keyedAcker{key: key, settled: settled}}
		}
		deliver("a", "gate")
		<-gateIn
		// A topic's dispatcher takes the next delivery off its channel only
		// after it queued the one before for the workers, so once both
		// channels are empty a1 and b1 are surely queued (a2 and b2 may be
		// in hand still): the worker the gate frees finds both topics.
		deliver("a", "a1")
		deliver("a", "a2")
		deliver("b", "b1")
		deliver("b", "b2")
		eventually(t, "the deliveries taken", func() bool { return len(sub["a"]) == 0 && len(sub["b"]) == 0 })
		close(gate)
		for range 5 {
			select {
			case <-settled:
			case <-time.After(10 * time.Second):
				t.Fatal("not every delivery was settled")
			}
		}
		close(sub["a"])
		close(sub["b"])
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		if groups == 0 {
			mu.Unlock()
			t.Fatalf("fail=%v: no group ran: the test proves nothing", fail)
		}
		if mixed {
			t.Errorf("fail=%v: a group held both topics (groups got %v)", fail, inGroups)
		}
		want := inGroups
		if fail {
			want = map[string]int{}
		}
		if !maps.Equal(reported, want) {
			t.Errorf("fail=%v: Grouped reported %v, want %v (what the committed groups held)", fail, reported, want)
		}
		mu.Unlock()
	}
}

// A burst of one topic's messages due at one instant does not hold back
// another topic's message due just after: the held messages of one topic
// never wait for room behind another's, topics take turns for the
// workers, and the spare worker takes a topic no worker is on, so the
// message runs while the burst's first group still does.
func TestConsumer_ABurstOnOneTopicDoesNotDelayAnother(t *testing.T) {
	t.Parallel()
	const burst, groupSize = 60, 5
	sub := topicSub{"a": make(chan *broker.Delivery, burst), "b": make(chan *broker.Delivery, 1)}
	pub := memory.New(memory.Config{})
	t.Cleanup(func() { _ = pub.Close() })
	var mu sync.Mutex
	var order []string // the first key of each group, in the order they ran
	c, err := broker.NewConsumer(sub, pub, func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		order = append(order, m.Key)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		return nil
	}, broker.ConsumerConfig{Logger: quiet(), Concurrency: 1, GroupSize: groupSize,
		Group: func(_ context.Context, msgs []*broker.Message) ([]error, error) {
			mu.Lock()
			order = append(order, msgs[0].Key)
			mu.Unlock()
			time.Sleep(50 * time.Millisecond) // a group's transaction
			return make([]error, len(msgs)), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), "a", "b"); err != nil {
		t.Fatal(err)
	}
	// Both arrive early and are held: the burst due at one instant, b's
	// message 10 ms after it.
	settled := make(chan string, burst+1)
	due := time.Now().Add(200 * time.Millisecond)
	for i := range burst {
		key := fmt.Sprintf("a%d", i)
		sub["a"] <- &broker.Delivery{Message: &broker.Message{Topic: "a", Key: key, DeliverAt: broker.MillisUTC(due)},
			Acker: keyedAcker{key: key, settled: settled}}
	}
	sub["b"] <- &broker.Delivery{Message: &broker.Message{Topic: "b", Key: "b", DeliverAt: broker.MillisUTC(due.Add(10 * time.Millisecond))},
		Acker: keyedAcker{key: "b", settled: settled}}
	for range burst + 1 {
		select {
		case <-settled:
		case <-time.After(10 * time.Second):
			t.Fatal("not every delivery was settled")
		}
	}
	close(sub["a"])
	close(sub["b"])
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	at := slices.Index(order, "b")
	if at < 0 {
		t.Fatalf("b never ran; groups began with %v", order)
	}
	// b comes due while the burst's first group runs, and the spare
	// worker runs it at once. The only worker would run it after the
	// second group (its lane queued behind the burst's), or, in due order,
	// after all burst/groupSize groups.
	if at > 1 {
		t.Errorf("b ran as group %d of %d (%v): behind the other topic's burst", at+1, len(order), order)
	}
}

// A consumer with no handler running stops cleanly even when Close's
// context is done already (the signal context that ended a service), and
// leaves no goroutine behind.
func TestConsumer_CloseWithADoneContextStopsAnIdleConsumerCleanly(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	b := memory.New(memory.Config{})
	defer b.Close()
	c, err := broker.NewConsumer(b, b, func(context.Context, *broker.Message) error { return nil }, broker.ConsumerConfig{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), "a", "b"); err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Close(done); err != nil {
		t.Fatalf("Close of an idle consumer with a done context = %v, want nil", err)
	}
}

// blockingSub's Subscribe waits for release, as a broker slow to assign
// queues does.
type blockingSub struct {
	entered, release chan struct{}
}

func (s blockingSub) Subscribe(ctx context.Context, _ string) (<-chan *broker.Delivery, error) {
	close(s.entered)
	<-s.release
	ch := make(chan *broker.Delivery)
	go func() { <-ctx.Done(); close(ch) }()
	return ch, nil
}

// A Close that runs while Start is still subscribing makes that Start
// fail with ErrClosed: it must not start workers nobody waits for, nor
// report a closed consumer as started.
func TestConsumer_StartRacingCloseReturnsErrClosed(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	sub := blockingSub{entered: make(chan struct{}), release: make(chan struct{})}
	pub := memory.New(memory.Config{})
	defer pub.Close()
	c, err := broker.NewConsumer(sub, pub, func(context.Context, *broker.Message) error { return nil }, broker.ConsumerConfig{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- c.Start(context.Background(), "a") }()
	<-sub.entered
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close during Start = %v", err)
	}
	close(sub.release)
	if err := <-started; !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Start that a Close overtook = %v, want ErrClosed", err)
	}
}

// countingSub wraps a Subscriber and counts every Ack and Nack the runtime
// calls, successful or not. The memory broker refuses (and does not count)
// a settle after the subscription ended, so after Close only this sees
// what the runtime tried to do.
type countingSub struct {
	broker.Subscriber
	acks, nacks atomic.Int64
}

func (s *countingSub) Subscribe(ctx context.Context, topic string) (<-chan *broker.Delivery, error) {
	in, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *broker.Delivery)
	go func() {
		defer close(out)
		for d := range in {
			d.Acker = countingAcker{inner: d.Acker, s: s}
			out <- d // the consumer reads its subscription until it closes
		}
	}()
	return out, nil
}

type countingAcker struct {
	inner broker.Acker
	s     *countingSub
}

func (a countingAcker) Ack() error  { a.s.acks.Add(1); return a.inner.Ack() }
func (a countingAcker) Nack() error { a.s.nacks.Add(1); return a.inner.Nack() }

// startOn starts a consumer reading from sub (bundle.start: the bundle's
// broker), with the bundle's dead letter and a quiet logger unless cfg
// sets them, and closes it when the test ends.
func (bd *bundle) startOn(t *testing.T, sub broker.Subscriber, h broker.Handler, cfg broker.ConsumerConfig) *broker.Consumer {
	t.Helper()
	if cfg.DeadLetter == nil {
		cfg.DeadLetter = bd.dead
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	c, err := broker.NewConsumer(sub, bd.b, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), bd.topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// groupBehindABusyWorker starts a one-worker consumer with group handler
// g, blocks the worker in the Handler on a message keyed "first", lets
// publish put more messages behind it and releases the worker once every
// one but the last is queued for it, so they reach the worker together. It
// returns the keys the Handler (one at a time) ran, in order.
func groupBehindABusyWorker(t *testing.T, bd *bundle, g broker.GroupHandler, cfg broker.ConsumerConfig, publish func()) (handled func() []string) {
	t.Helper()
	started, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var keys []string
	cfg.Concurrency = 1
	cfg.Group = g
	bd.start(t, func(ctx context.Context, m *broker.Message) error {
		if m.Key == "first" {
			close(started)
			<-release
		}
		mu.Lock()
		keys = append(keys, m.Key)
		mu.Unlock()
		return nil
	}, cfg)
	bd.publish(t, "first", time.Now())
	<-started
	before := bd.b.Stats().Delivered
	publish()
	n := bd.b.Stats().Published - 1
	// The subscription hands deliveries over one at a time: once the last
	// was taken from the queue, every one before it was dispatched.
	eventually(t, "every message delivered", func() bool { return bd.b.Stats().Delivered == before+n })
	close(release)
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), keys...)
	}
}

// No message of a group is acked before the GroupHandler returned: its
// transaction may still fail, and then each message runs again.
func TestConsumer_GroupIsAckedOnlyAfterTheGroupHandlerReturns(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	entered := make(chan memory.Stats, 1)
	releaseGroup := make(chan struct{})
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(releaseGroup) }) }
	var once sync.Once
	var grouped atomic.Int64
	groupBehindABusyWorker(t, bd, func(ctx context.Context, msgs []*broker.Message) ([]error, error) {
		once.Do(func() {
			entered <- bd.b.Stats()
			<-releaseGroup
		})
		grouped.Add(int64(len(msgs)))
		return make([]error, len(msgs)), nil
	}, broker.ConsumerConfig{}, func() {
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			bd.publish(t, k, time.Now())
		}
	})
	t.Cleanup(release) // registered after the consumer's Close, so it runs first
	var s memory.Stats
	select {
	case s = <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the group handler never ran")
	}
	// Only "first", handled alone before the group, is acked.
	if s.Acked != 1 {
		t.Fatalf("%d acked as the group handler started; want only the message handled before it", s.Acked)
	}
	if s := bd.b.Stats(); s.Acked != 1 {
		t.Fatalf("%d acked while the group handler was still running; want 1", s.Acked)
	}
	release()
	eventually(t, "every message acked", func() bool { return bd.b.Stats().Acked == 6 })
	if grouped.Load() < 2 {
		t.Fatalf("the group handler took %d messages, want the waiting ones", grouped.Load())
	}
}

// With a group handler, only decoded, due messages of the subscribed topic
// go into a group: one due beyond the hold window is hopped and one naming
// another topic goes dead, even when they wait in the queue among due ones.
func TestConsumer_GroupNeverTakesAMessageNotDueOrOfAnotherTopic(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	var mu sync.Mutex
	var grouped []string
	hopped := make(chan struct{})
	var hopOnce sync.Once
	handled := groupBehindABusyWorker(t, bd, func(ctx context.Context, msgs []*broker.Message) ([]error, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			grouped = append(grouped, m.Key)
		}
		return make([]error, len(msgs)), nil
	}, broker.ConsumerConfig{
		Hooks: broker.Hooks{Hopped: func(string, int) { hopOnce.Do(func() { close(hopped) }) }},
	}, func() {
		bd.publish(t, "due1", time.Now())
		// Delivered at once, an hour early: beyond the hold window.
		far := &broker.Message{Topic: bd.topic, Key: "far", DeliverAt: broker.MillisUTC(time.Now().Add(time.Hour))}
		if err := bd.b.PublishRaw(bd.topic, broker.Encode(far), nil); err != nil {
			t.Fatal(err)
		}
		forged := &broker.Message{Topic: "other", Key: "forged", DeliverAt: broker.MillisUTC(time.Now())}
		if err := bd.b.PublishRaw(bd.topic, broker.Encode(forged), nil); err != nil {
			t.Fatal(err)
		}
		bd.publish(t, "due2", time.Now())
		bd.publish(t, "due3", time.Now())
	})
	// "first" and the three due ones.
	eventually(t, "the due messages handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(grouped)+len(handled()) >= 4
	})
	mu.Lock()
	group := append([]string(nil), grouped...)
	mu.Unlock()
	alone := handled()
	for _, k := range append(append([]string(nil), group...), alone...) {
		if k == "far" || k == "forged" {
			t.Fatalf("group %v, handled alone %v: %q reached a handler", group, alone, k)
		}
	}
	if len(group) < 2 {
		t.Fatalf("group %v: want the due messages waiting behind the busy worker grouped", group)
	}
	eventually(t, "the forged message dead", func() bool { return bd.dead.get("forged") != nil })
	select {
	case <-hopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the far message was never hopped")
	}
	if err := bd.dead.get("forged"); !errors.Is(err, broker.ErrWrongTopic) {
		t.Fatalf("forged message dead with %v, want ErrWrongTopic", err)
	}
}

// A group handler that reports fewer results than it got messages has
// failed as a whole: no crash, and each message of the group then runs
// through the Handler one at a time and is acked once.
func TestConsumer_GroupWithTooFewResultsFallsBackToOneAtATime(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	var mu sync.Mutex
	var grouped []string
	var sizes []int
	handled := groupBehindABusyWorker(t, bd, func(ctx context.Context, msgs []*broker.Message) ([]error, error) {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(msgs))
		for _, m := range msgs {
			grouped = append(grouped, m.Key)
		}
		return make([]error, len(msgs)-1), nil
	}, broker.ConsumerConfig{}, func() {
		for _, k := range []string{"a", "b", "c", "d"} {
			bd.publish(t, k, time.Now())
		}
	})
	eventually(t, "every message acked", func() bool { return bd.b.Stats().Acked == 5 })
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) == 0 {
		t.Fatal("the group handler never ran")
	}
	runs := map[string]int{}
	for _, k := range handled() {
		runs[k]++
	}
	for _, k := range grouped {
		if runs[k] != 1 {
			t.Fatalf("grouped %v (sizes %v), handled alone %v: %q ran %d times alone, want once", grouped, sizes, handled(), k, runs[k])
		}
	}
	if s := bd.b.Stats(); s.Nacked != 0 || s.Acked != 5 || s.Delivered != 5 {
		t.Fatalf("stats %+v: want each message delivered and acked once", s)
	}
}
