package broker_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/memory"
)

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

// A group takes what is due whatever its topic, and Hooks.Grouped tells
// each topic how many of its messages the transaction committed; a group
// that failed whole committed nothing and is not reported.
func TestConsumer_GroupedReportsEachTopicOfACommittedGroup(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		sub := topicSub{"a": make(chan *broker.Delivery, 8), "b": make(chan *broker.Delivery, 8)}
		pub := memory.New(memory.Config{})
		t.Cleanup(func() { _ = pub.Close() })
		gateIn, gate := make(chan struct{}), make(chan struct{})
		var mu sync.Mutex
		inGroups := map[string]int{} // topic → messages the group handler got
		reported := map[string]int{} // topic → what Grouped said
		mixed := false
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
				seen := map[string]bool{}
				for _, m := range msgs {
					inGroups[m.Topic]++
					seen[m.Topic] = true
				}
				mixed = mixed || len(seen) > 1
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
		if !mixed {
			mu.Unlock()
			t.Fatalf("fail=%v: no group held both topics (groups got %v): the test proves nothing", fail, inGroups)
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
