package rabbit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// seen records what a handler ran, by key.
type seen struct {
	mu    sync.Mutex
	at    map[string]time.Time
	count map[string]int
}

func newSeen() *seen { return &seen{at: map[string]time.Time{}, count: map[string]int{}} }

func (s *seen) handle(_ context.Context, m *broker.Message) error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.at[m.Key]; !ok {
		s.at[m.Key] = now
	}
	s.count[m.Key]++
	return nil
}

func (s *seen) has(keys []string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range keys {
		if _, ok := s.at[k]; ok {
			n++
		}
	}
	return n
}

// waitAll polls until every key was handled or the wait ends.
func (s *seen) waitAll(t *testing.T, keys []string, wait time.Duration) {
	t.Helper()
	if !testutil.Eventually(wait, 50*time.Millisecond, func() bool { return s.has(keys) == len(keys) }) {
		t.Fatalf("%d of %d messages handled after %v", s.has(keys), len(keys), wait)
	}
}

// checkNeverEarly fails for each message handled before its due time.
func (s *seen) checkNeverEarly(t *testing.T, msgs []*broker.Message) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		if at, ok := s.at[m.Key]; ok && at.Before(m.DeliverAt) {
			t.Errorf("%s handled %v early", m.Key, m.DeliverAt.Sub(at))
		}
	}
}

// startConsumer runs the broker runtime over the bundle's clients.
func startConsumer(t *testing.T, b *bundle, topic string, h broker.Handler) *Publisher {
	t.Helper()
	pub, sub := b.clients(t, topic)
	dead := broker.DeadLetterFunc(func(_ context.Context, d *broker.Delivery, reason error) error {
		t.Errorf("unexpected dead letter: %v", reason)
		return nil
	})
	c, err := broker.NewConsumer(sub, pub, h, broker.ConsumerConfig{DeadLetter: dead, Concurrency: 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return pub
}

// spread returns n messages for topic due between from and to from now.
func spread(topic, prefix string, n int, from, to time.Duration) ([]*broker.Message, []string) {
	now := time.Now()
	msgs := make([]*broker.Message, n)
	keys := make([]string, n)
	for i := range msgs {
		d := from + (to-from)*time.Duration(i)/time.Duration(max(n-1, 1))
		keys[i] = fmt.Sprintf("%s-%d", prefix, i)
		msgs[i] = &broker.Message{Topic: topic, Key: keys[i], Payload: []byte(keys[i]), DeliverAt: broker.MillisUTC(now.Add(d))}
	}
	return msgs, keys
}

// rabbitmqctl is the command testenv.Rabbitmqctl runs, for running it in
// the background.
func rabbitmqctl() string {
	if v := os.Getenv("DELAYBRIDGE_RABBITMQCTL"); v != "" {
		return v
	}
	return "rabbitmqctl"
}

// connectionPID finds the pid of the connection whose connection_name is name.
func connectionPID(t *testing.T, name string) string {
	t.Helper()
	var out, pid string
	if !testutil.Eventually(10*time.Second, 100*time.Millisecond, func() bool {
		out = testenv.Rabbitmqctl(t, "list_connections", "-q", "pid", "client_properties")
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, fmt.Sprintf(`{"connection_name","%s"}`, name)) {
				pid = strings.Fields(line)[0]
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no connection named %q in:\n%s", name, out)
	}
	return pid
}

func TestSubscriber_KilledConnectionReconnectsAndLosesNothing(t *testing.T) {
	b := setup(t)
	topic := "killed"
	got := newSeen()
	pub := startConsumer(t, b, topic, got.handle)
	msgs, keys := spread(topic, "k", 200, 0, 3*time.Second)
	if err := pub.Publish(context.Background(), msgs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	for got.has(keys) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	pid := connectionPID(t, b.cfg.ConnectionName+" subscriber "+topic)
	testenv.Rabbitmqctl(t, "close_connection", pid, "delaybridge test: kill the subscriber")
	got.waitAll(t, keys, 60*time.Second)
	got.checkNeverEarly(t, msgs)
	if pid2 := connectionPID(t, b.cfg.ConnectionName+" subscriber "+topic); pid2 == pid {
		t.Errorf("the subscriber's connection %s is the killed one", pid)
	}
}

func TestPublisher_KilledConnectionNeverReportsUnconfirmedAsConfirmed(t *testing.T) {
	// The kill runs in the background and can land between two batches,
	// where no message awaits a confirm and the test proves nothing: then
	// it starts over.
	const attempts = 3
	for attempt := 1; attempt <= attempts; attempt++ {
		if killPublisherMidBatch(t) {
			return
		}
		t.Logf("attempt %d: the kill landed between batches; starting over", attempt)
	}
	t.Fatalf("in %d attempts the kill never landed while a batch awaited its confirms", attempts)
}

// killPublisherMidBatch publishes batches on a single connection while
// rabbitmqctl kills it, until a batch after the kill went through whole.
// It fails the test when a message reported confirmed never arrives or a
// message failed for another reason than the lost connection, and reports
// whether the kill cut through a batch: some of its messages confirmed,
// the others failed.
func killPublisherMidBatch(t *testing.T) bool {
	t.Helper()
	b := setup(t)
	b.cfg.Channels = 1 // every batch goes through the connection that is killed
	topic := "pubkill"
	pub, sub := b.clients(t, topic)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deliveries, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	received := map[string]bool{}
	var rmu sync.Mutex
	go func() {
		for d := range deliveries {
			if d.Message != nil {
				rmu.Lock()
				received[d.Message.Key] = true
				rmu.Unlock()
			}
			_ = d.Acker.Ack()
		}
	}()

	pid := connectionPID(t, b.cfg.ConnectionName+" publisher 0")
	var killOut bytes.Buffer
	kill := exec.Command(rabbitmqctl(), "close_connection", pid, "delaybridge test: kill the publisher")
	kill.Stdout, kill.Stderr = &killOut, &killOut
	if err := kill.Start(); err != nil {
		t.Fatal(err)
	}
	killed := make(chan error, 1)
	go func() { killed <- kill.Wait() }()

	var confirmed []string
	failed, cut := 0, 0
	afterKill := false
	deadline := time.Now().Add(60 * time.Second)
	for batch := 0; ; batch++ {
		select {
		case err := <-killed:
			if err != nil {
				t.Fatalf("rabbitmqctl close_connection: %v\n%s", err, killOut.String())
			}
			afterKill = true
		default:
		}
		msgs, keys := spread(topic, fmt.Sprintf("b%d", batch), 1000, 0, 0)
		ok, bad := 0, 0
		for i, err := range broker.PublishResults(pub.Publish(context.Background(), msgs...), len(msgs)) {
			switch {
			case err == nil:
				confirmed = append(confirmed, keys[i])
				ok++
			case errors.Is(err, ErrConnectionLost):
				bad++
			default:
				t.Fatalf("%s failed for another reason than the kill: %v", keys[i], err)
			}
		}
		failed += bad
		if ok > 0 && bad > 0 {
			cut++
		}
		if afterKill && bad == 0 {
			break // a whole batch after the kill: the publisher is back
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d batches the publisher still fails (kill returned: %v)", batch+1, afterKill)
		}
	}
	t.Logf("confirmed %d, reported failed %d, batches cut by the kill %d", len(confirmed), failed, cut)
	var missing int
	if !testutil.Eventually(time.Until(deadline), 100*time.Millisecond, func() bool {
		rmu.Lock()
		defer rmu.Unlock()
		missing = 0
		for _, k := range confirmed {
			if !received[k] {
				missing++
			}
		}
		return missing == 0
	}) {
		t.Fatalf("%d messages reported confirmed never arrived", missing)
	}
	if pid2 := connectionPID(t, b.cfg.ConnectionName+" publisher 0"); pid2 == pid {
		t.Errorf("the publisher did not reconnect")
	}
	return cut > 0
}

func TestLadder_MessagesInLevelsSurviveBrokerRestart(t *testing.T) {
	b := setup(t)
	topic := "restart"
	got := newSeen()
	pub := startConsumer(t, b, topic, got.handle)
	// Up to 3 hops of 3.75s, so messages sit in every level and mid-chain.
	msgs, keys := spread(topic, "r", 120, 500*time.Millisecond, 10*time.Second)
	if err := pub.Publish(context.Background(), msgs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	started := false
	t.Cleanup(func() {
		if !started {
			testenv.Rabbitmqctl(t, "start_app")
		}
	})
	testenv.Rabbitmqctl(t, "stop_app")
	if n := got.has(keys); n == len(keys) {
		t.Fatal("every message was handled before the broker stopped; the test proves nothing")
	} else {
		t.Logf("%d of %d messages still in the ladder when the broker stopped", len(keys)-n, len(keys))
	}
	testenv.Rabbitmqctl(t, "start_app")
	started = true
	testenv.Rabbitmqctl(t, "await_startup")
	got.waitAll(t, keys, 120*time.Second)
	got.checkNeverEarly(t, msgs)
}

// execRabbitmqctl runs rabbitmqctl without a test to fail.
func execRabbitmqctl(args ...string) (string, error) {
	out, err := exec.Command(rabbitmqctl(), args...).CombinedOutput()
	return string(out), err
}
