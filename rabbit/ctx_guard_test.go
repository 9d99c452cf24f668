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
