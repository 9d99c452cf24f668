package broker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
)

// A topic's policy sets its own attempts and handler timeout: the
// "quick" topic goes dead after its 2 attempts, each run bounded by its
// 50 ms, while "steady", on the same consumer, keeps the consumer-wide 3
// attempts and 1 minute.
func TestConsumer_ATopicPolicySetsItsAttemptsAndTimeout(t *testing.T) {
	t.Parallel()
	b := memory.New(memory.Config{})
	t.Cleanup(func() { _ = b.Close() })
	dead := &deadBox{reasons: map[string]error{}}
	var mu sync.Mutex
	runs := map[string]int{}
	budget := map[string]time.Duration{}
	c, err := broker.NewConsumer(b, b, func(ctx context.Context, m *broker.Message) error {
		dl, _ := ctx.Deadline()
		mu.Lock()
		runs[m.Topic]++
		budget[m.Topic] = max(budget[m.Topic], time.Until(dl))
		mu.Unlock()
		return errors.New("down")
	}, broker.ConsumerConfig{Logger: quiet(), DeadLetter: dead, MaxAttempts: 3, HandlerTimeout: time.Minute,
		Backoff: broker.Backoff{Initial: 5 * time.Millisecond, Max: 5 * time.Millisecond},
		Topics:  map[string]broker.TopicPolicy{"quick": {MaxAttempts: 2, HandlerTimeout: 50 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), "quick", "steady"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	for _, topic := range []string{"quick", "steady"} {
		if err := b.Publish(context.Background(), &broker.Message{Topic: topic, Key: topic, DeliverAt: broker.MillisUTC(time.Now())}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "both dead", func() bool { return dead.get("quick") != nil && dead.get("steady") != nil })
	mu.Lock()
	defer mu.Unlock()
	if runs["quick"] != 2 || runs["steady"] != 3 {
		t.Errorf("runs %v: want quick 2 (its policy), steady 3 (the consumer's)", runs)
	}
	if !strings.Contains(dead.get("quick").Error(), "failed 2 attempts") || !errors.Is(dead.get("quick"), broker.ErrHandlerFailed) {
		t.Errorf("quick's dead reason %v: want failed 2 attempts, matching ErrHandlerFailed", dead.get("quick"))
	}
	if budget["quick"] > 50*time.Millisecond || budget["steady"] < 30*time.Second {
		t.Errorf("handler time left at start: quick %v, steady %v; want at most 50ms and about a minute", budget["quick"], budget["steady"])
	}
}

// A topic's policy sets its own backoff: its retries are due after its
// delay, the others' after the consumer's.
func TestConsumer_ATopicPolicySetsItsBackoff(t *testing.T) {
	t.Parallel()
	b := memory.New(memory.Config{})
	t.Cleanup(func() { _ = b.Close() })
	var mu sync.Mutex
	waits := map[string]time.Duration{}
	c, err := broker.NewConsumer(b, b, func(context.Context, *broker.Message) error { return errors.New("down") },
		broker.ConsumerConfig{Logger: quiet(), DeadLetter: &deadBox{reasons: map[string]error{}},
			Backoff: broker.Backoff{Initial: time.Hour, Max: time.Hour},
			Topics:  map[string]broker.TopicPolicy{"soon": {Backoff: broker.Backoff{Initial: time.Minute, Max: time.Minute}}},
			OnRetry: func(_ context.Context, m *broker.Message, _ error) error {
				mu.Lock()
				waits[m.Topic] = time.Until(m.DeliverAt)
				mu.Unlock()
				return nil
			}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), "soon", "later"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	for _, topic := range []string{"soon", "later"} {
		if err := b.Publish(context.Background(), &broker.Message{Topic: topic, Key: topic, DeliverAt: broker.MillisUTC(time.Now())}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "both retried", func() bool { mu.Lock(); defer mu.Unlock(); return len(waits) == 2 })
	mu.Lock()
	defer mu.Unlock()
	// ±50% jitter around each.
	if w := waits["soon"]; w < 29*time.Second || w > 91*time.Second {
		t.Errorf("soon's retry in %v, want about its minute", w)
	}
	if w := waits["later"]; w < 29*time.Minute {
		t.Errorf("later's retry in %v, want about the consumer's hour", w)
	}
}

// The runtime keeps each topic's group policy: a topic that runs alone is
// never handed to the group handler, a capped topic never has more than
// its cap in one group, and topics of different timeouts never share one.
func TestConsumer_GroupsKeepEachTopicsPolicy(t *testing.T) {
	t.Parallel()
	b := memory.New(memory.Config{})
	t.Cleanup(func() { _ = b.Close() })
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var groups [][]string
	var alone []string
	handled := 0
	topics := []string{"gate", "alone", "capped", "free", "slow"}
	c, err := broker.NewConsumer(b, b, func(ctx context.Context, m *broker.Message) error {
		if m.Topic == "gate" {
			once.Do(func() { close(started); <-release })
		}
		mu.Lock()
		alone = append(alone, m.Topic)
		handled++
		mu.Unlock()
		return nil
	}, broker.ConsumerConfig{Logger: quiet(), DeadLetter: &deadBox{reasons: map[string]error{}}, Concurrency: 1,
		Topics: map[string]broker.TopicPolicy{"alone": {GroupSize: 1}, "capped": {GroupSize: 3}, "slow": {HandlerTimeout: time.Hour}},
		Group: func(ctx context.Context, msgs []*broker.Message) ([]error, error) {
			var g []string
			for _, m := range msgs {
				g = append(g, m.Topic)
			}
			mu.Lock()
			groups = append(groups, g)
			handled += len(msgs)
			mu.Unlock()
			return make([]error, len(msgs)), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), topics...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	publish := func(topic string, n int) {
		for range n {
			if err := b.Publish(context.Background(), &broker.Message{Topic: topic, Key: "k", DeliverAt: broker.MillisUTC(time.Now())}); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("gate", 1)
	<-started
	publish("alone", 5)
	publish("capped", 7)
	publish("free", 6)
	publish("slow", 4)
	eventually(t, "all delivered", func() bool { return b.Stats().Delivered >= 23 })
	time.Sleep(200 * time.Millisecond)
	close(release)
	eventually(t, "all handled", func() bool { mu.Lock(); defer mu.Unlock(); return handled == 23 })
	mu.Lock()
	defer mu.Unlock()
	if len(groups) == 0 {
		t.Fatal("no group formed")
	}
	for _, g := range groups {
		n := map[string]int{}
		for _, topic := range g {
			n[topic]++
		}
		if n["alone"] > 0 || n["capped"] > 3 || n["slow"] > 0 && len(n) > 1 {
			t.Errorf("group %v: want no alone, at most 3 capped, slow only with slow", g)
		}
	}
	if got := strings.Count(strings.Join(alone, " "), "alone"); got != 5 {
		t.Errorf("the handler ran %d alone messages on their own, want 5 (handled alone: %v)", got, alone)
	}
}

// A group handler's word on a message's attempt (the count its store
// keeps, as outbox.HandleGroup reads it from the task row) decides retry
// or dead, not the attempt the message arrived with.
func TestConsumer_AGroupsAttemptCountDecidesDead(t *testing.T) {
	t.Parallel()
	b := memory.New(memory.Config{})
	t.Cleanup(func() { _ = b.Close() })
	dead := &deadBox{reasons: map[string]error{}}
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var grouped atomic.Int64
	c, err := broker.NewConsumer(b, b, func(ctx context.Context, m *broker.Message) error {
		if m.Key == "gate" {
			once.Do(func() { close(started); <-release })
			return nil
		}
		return errors.New("down")
	}, broker.ConsumerConfig{Logger: quiet(), DeadLetter: dead, Concurrency: 1, MaxAttempts: 10,
		Backoff: broker.Backoff{Initial: time.Hour, Max: time.Hour},
		Group: func(ctx context.Context, msgs []*broker.Message) ([]error, error) {
			grouped.Add(1)
			errs := make([]error, len(msgs))
			for i, m := range msgs {
				m.Attempt = 9 // the store's count: this run is the last
				errs[i] = errors.New("down")
			}
			return errs, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	for _, k := range []string{"gate", "a", "b"} {
		if err := b.Publish(context.Background(), &broker.Message{Topic: "orders", Key: k, DeliverAt: broker.MillisUTC(time.Now())}); err != nil {
			t.Fatal(err)
		}
		if k == "gate" {
			<-started
		}
	}
	eventually(t, "all delivered", func() bool { return b.Stats().Delivered >= 3 })
	time.Sleep(200 * time.Millisecond)
	close(release)
	eventually(t, "a and b dead", func() bool { return dead.get("a") != nil && dead.get("b") != nil })
	if grouped.Load() != 1 || !strings.Contains(dead.get("a").Error(), "failed 10 attempts") {
		t.Fatalf("groups %d, a's dead reason %v; want one group, failed 10 attempts", grouped.Load(), dead.get("a"))
	}
}

// NewConsumer refuses a topic policy it could not run.
func TestNewConsumer_RefusesABadTopicPolicy(t *testing.T) {
	t.Parallel()
	for name, p := range map[string]map[string]broker.TopicPolicy{
		"negative group":     {"t": {GroupSize: -1}},
		"negative attempts":  {"t": {MaxAttempts: -1}},
		"negative timeout":   {"t": {HandlerTimeout: -time.Second}},
		"shrinking backoff":  {"t": {Backoff: broker.Backoff{Multiplier: 0.5}}},
		"start above max":    {"t": {Backoff: broker.Backoff{Initial: 2 * time.Hour}}},
		"invalid topic name": {"a b": {GroupSize: 1}},
	} {
		if err := (broker.ConsumerConfig{Topics: p}).Check(); err == nil {
			t.Errorf("%s: Check accepted %v", name, p)
		}
	}
	if err := (broker.ConsumerConfig{Topics: map[string]broker.TopicPolicy{"t": {GroupSize: 1, MaxAttempts: 3}}}).Check(); err != nil {
		t.Errorf("a sound policy refused: %v", err)
	}
}

// A topic's Rate bounds how fast its deliveries reach the handler, from
// their due time, and only its own: another topic's go by. Every delivery
// is handled in the end, none early, and the waiting is reported.
func TestConsumer_RateBoundsOnlyItsTopic(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{Limits: broker.Limits{Precision: 300 * time.Millisecond}, Early: 300 * time.Millisecond})
	const limited, free, perSecond = 40, 5, 20.0
	var mu sync.Mutex
	handled := map[string][]time.Time{}
	var waited atomic.Int64
	// Due a little after they arrive, as a broker delivers ahead of the
	// due time: the rate counts from the due time, not from the arrival.
	start := time.Now().Add(300 * time.Millisecond)
	due := broker.MillisUTC(start).Add(time.Millisecond)
	for i := range limited {
		bd.publish(t, fmt.Sprintf("l-%d", i), due)
	}
	for i := range free {
		if err := bd.b.Publish(context.Background(), &broker.Message{Topic: "other", Key: fmt.Sprintf("f-%d", i), DeliverAt: due}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := broker.NewConsumer(bd.b, bd.b, func(_ context.Context, m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if time.Now().Before(m.DeliverAt) {
			t.Errorf("%s handled early", m.Key)
		}
		handled[m.Topic] = append(handled[m.Topic], time.Now())
		return nil
	}, broker.ConsumerConfig{Logger: quiet(), Topics: map[string]broker.TopicPolicy{bd.topic: {Rate: perSecond}},
		DeadLetter: bd.dead, Hooks: broker.Hooks{Limited: func(_ string, d time.Duration) { waited.Add(int64(d)) }}})
	bd.startBoth(t, c, err)
	eventually(t, "every delivery handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled[bd.topic]) == limited && len(handled["other"]) == free
	})
	mu.Lock()
	defer mu.Unlock()
	// The k-th delivery of the limited topic needs k tokens: the burst
	// (2) at once, then one each 1/perSecond.
	for k, at := range handled[bd.topic] {
		if allowed := 2 + perSecond*at.Sub(start).Seconds(); float64(k+1) > allowed+1 {
			t.Fatalf("delivery %d of the limited topic handled %v after the start, beyond %v a second", k+1, at.Sub(start), perSecond)
		}
	}
	if last := handled["other"][free-1]; !last.Before(handled[bd.topic][limited/2]) {
		t.Errorf("the free topic's last delivery came after half the limited topic's: the limit held it back")
	}
	if waited.Load() == 0 {
		t.Error("no wait reported to Hooks.Limited")
	}
	if err := (broker.ConsumerConfig{Topics: map[string]broker.TopicPolicy{"x": {Rate: -1}}}).Check(); err == nil {
		t.Error("a negative Rate passed Check")
	}
}

// A topic's Concurrency bounds how many of its deliveries are in the
// handler at once, though the workers could run more; another topic's
// delivery goes by while the bound holds the rest back. Every delivery
// is handled in the end.
func TestConsumer_ConcurrencyBoundsOnlyItsTopic(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{})
	const n, bound = 6, 2
	var mu sync.Mutex
	in, most, done := 0, 0, map[string]bool{}
	release := make(chan struct{})
	otherDone := make(chan struct{})
	c, err := broker.NewConsumer(bd.b, bd.b, func(_ context.Context, m *broker.Message) error {
		if m.Topic == "other" {
			close(otherDone)
			return nil
		}
		mu.Lock()
		in++
		most = max(most, in)
		mu.Unlock()
		<-release
		mu.Lock()
		defer mu.Unlock()
		in--
		done[m.Key] = true
		return nil
	}, broker.ConsumerConfig{Logger: quiet(), Concurrency: 8, DeadLetter: bd.dead,
		Topics: map[string]broker.TopicPolicy{bd.topic: {Concurrency: bound}}})
	bd.startBoth(t, c, err)
	for i := range n {
		bd.publish(t, fmt.Sprintf("k-%d", i), time.Now())
	}
	eventually(t, "the bound's worth in the handler", func() bool { mu.Lock(); defer mu.Unlock(); return in == bound })
	if err := bd.b.Publish(context.Background(), &broker.Message{Topic: "other", Key: "o", DeliverAt: broker.MillisUTC(time.Now())}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-otherDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the other topic's delivery waited behind the bound")
	}
	// Let them through one at a time.
	for range n {
		select {
		case release <- struct{}{}:
		case <-time.After(10 * time.Second):
			t.Fatal("a delivery never reached the handler: a slot was not given back")
		}
	}
	eventually(t, "every delivery handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(done) == n })
	mu.Lock()
	defer mu.Unlock()
	if most != bound {
		t.Fatalf("%d deliveries of the topic were in the handler at once, want at most and at least %d", most, bound)
	}
	if err := (broker.ConsumerConfig{Topics: map[string]broker.TopicPolicy{"x": {Concurrency: -1}}}).Check(); err == nil {
		t.Error("a negative Concurrency passed Check")
	}
}

// startBoth starts c, as NewConsumer returned it with err, on the
// bundle's topic and on "other", and closes it at cleanup.
func (bd *bundle) startBoth(t *testing.T, c *broker.Consumer, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), bd.topic, "other"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
}
