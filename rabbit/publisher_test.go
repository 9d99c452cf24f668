package rabbit

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
)

// freezeUp holds what the client sends from now on, and lets the broker's
// frames (its heartbeats) through: a broker that stopped reading a
// connection, as one does for a publisher while a memory or disk alarm
// blocks it.
func (p *gateProxy) freezeUp() {
	p.mu.Lock()
	p.frozen[up], p.held[up] = true, 0
	p.mu.Unlock()
}

// Close returns while the broker reads nothing of the connection: it fails
// what is unconfirmed and closes the socket under the connection rather
// than wait for a close-ok that comes only when the alarm ends (hours for
// a disk alarm), which held a stopping daemon until it was killed.
func TestPublisher_CloseReturnsWhileTheBrokerStopsReading(t *testing.T) {
	b := setup(t)
	// Heartbeats every minute: the broker does not give up on the silent
	// connection within this test, as it does not on one it blocked.
	b.cfg.Heartbeat = time.Minute
	topic := "blocked"
	pub, proxy := proxiedPublisher(t, b, topic, DefaultConfirmWindow)
	proxy.freezeUp()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, guardMsgs(topic, "b", 50)...); err == nil {
		t.Fatal("Publish through a connection the broker does not read succeeded")
	}
	proxy.waitHeld(t, up)
	closed := make(chan struct{})
	began := time.Now()
	go func() { _ = pub.Close(); close(closed) }()
	select {
	case <-closed:
		t.Logf("Close returned after %v", time.Since(began).Round(100*time.Millisecond))
	case <-time.After(45 * time.Second):
		t.Fatal("Close still waits on a broker that does not read the connection")
	}
}

// endsAfterFirstCheck is a context that reports itself live to the first
// Err call and ended to everything after: the caller's deadline passing
// between the publish loop's check and its publish, as it does when the
// check is followed by a topic's declaration on a slow broker.
type endsAfterFirstCheck struct {
	context.Context
	checked atomic.Bool
	done    chan struct{}
}

func (c *endsAfterFirstCheck) Err() error {
	if c.checked.CompareAndSwap(false, true) {
		close(c.done)
		return nil
	}
	return context.DeadlineExceeded
}

func (c *endsAfterFirstCheck) Done() <-chan struct{} { return c.done }

// warnings keeps the messages of the warnings logged.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, r.Message)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

// A caller whose context ends after the publish loop checked it does not
// take the publisher's connection down: the message goes out on the
// channel as it is, and other callers' unconfirmed messages are not failed
// with it. Handing the context to the client made its end look like a
// lost channel: every pending confirm failed and the connection was
// closed and dialled again.
func TestPublisher_ACallersContextEndingMidPublishKeepsTheConnection(t *testing.T) {
	b := setup(t)
	b.cfg.Channels = 1
	log := &warnings{}
	b.cfg.Logger = slog.New(log)
	topic := "ctxend"
	pub, _ := b.clients(t, topic)
	ctx := &endsAfterFirstCheck{Context: context.Background(), done: make(chan struct{})}
	// The caller's own wait sees its context end; the message was sent.
	_ = pub.Publish(ctx, &broker.Message{Topic: topic, Key: "late-caller", DeliverAt: broker.MillisUTC(time.Now())})
	live, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pub.Publish(live, &broker.Message{Topic: topic, Key: "next", DeliverAt: broker.MillisUTC(time.Now())}); err != nil {
		t.Fatalf("the next publish: %v", err)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, w := range log.list {
		if strings.Contains(w, "lost its channel") {
			t.Fatalf("a caller's context ending took the connection down: %q", log.list)
		}
	}
}
