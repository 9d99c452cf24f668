package brokertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/wire"
)

// foreignCase is one message a foreign producer puts on a consumer's queue.
type foreignCase struct {
	name string
	// headers, or values when the case needs header types other than
	// string (only run when Harness.PublishRawValues is set).
	headers map[string]string
	values  map[string]any
	// reason is a part of the dead reason; empty means the message is
	// valid after all and must be handled.
	reason string
	// badUTF8 marks a case whose point is invalid UTF-8 in a header: on a
	// broker with HeadersAlwaysUTF8 it arrives repaired and is handled.
	badUTF8 bool
}

// foreignCases returns the foreign messages of testForeign. Each body is
// "foreign-" plus the case name, which is how the test recognises it in the
// dead topic, where an undecodable message travels under the key
// "malformed".
func foreignCases(topic string) []foreignCase {
	envelope := func(name string, edit func(h map[string]string)) map[string]string {
		h := broker.Encode(message(topic, "foreign-"+name, time.Now()))
		edit(h)
		return h
	}
	values := func(name string, edit func(h map[string]any)) map[string]any {
		h := map[string]any{}
		for k, v := range broker.Encode(message(topic, "foreign-"+name, time.Now())) {
			h[k] = v
		}
		edit(h)
		return h
	}
	many := func(prefix string, n int) map[string]string {
		h := map[string]string{}
		for i := range n {
			h[fmt.Sprintf("%s%04d", prefix, i)] = "v"
		}
		return h
	}
	big := strings.Repeat("b", 64<<10+1)
	return []foreignCase{
		{name: "no-envelope", headers: map[string]string{"content-type": "text/plain"}, reason: "no delaybridge envelope"},
		{name: "no-envelope-64KiB-header", headers: map[string]string{"x-big": big}, reason: "no delaybridge envelope"},
		{name: "no-envelope-500-headers", headers: many("x-", 500), reason: "no delaybridge envelope"},
		{name: "version-2", headers: envelope("version-2", func(h map[string]string) { h[wire.HeaderVersion] = "2" }), reason: wire.HeaderVersion},
		{name: "due-abc", headers: envelope("due-abc", func(h map[string]string) { h[wire.HeaderDeliverAt] = "abc" }), reason: wire.HeaderDeliverAt},
		{name: "due-overflows", headers: envelope("due-overflows", func(h map[string]string) { h[wire.HeaderDeliverAt] = "99999999999999999999" }), reason: wire.HeaderDeliverAt},
		{name: "hop-negative", headers: envelope("hop-negative", func(h map[string]string) { h[wire.HeaderHop] = "-1" }), reason: wire.HeaderHop},
		{name: "key-missing", headers: envelope("key-missing", func(h map[string]string) { delete(h, wire.HeaderKey) }), reason: wire.HeaderKey},
		{name: "topic-with-a-dot", headers: envelope("topic-with-a-dot", func(h map[string]string) { h[wire.HeaderTopic] = "a.b" }), reason: wire.HeaderTopic},
		{name: "trace-1KiB", headers: envelope("trace-1KiB", func(h map[string]string) { h[wire.HeaderTrace] = strings.Repeat("t", 1024) }), reason: wire.HeaderTrace},
		{name: "free-header-64KiB", headers: envelope("free-header-64KiB", func(h map[string]string) { h[wire.HeaderFreePrefix+"big"] = big }), reason: "free headers exceed"},
		{name: "free-headers-1000", headers: envelope("free-headers-1000", func(h map[string]string) {
			for k, v := range many(wire.HeaderFreePrefix, 1000) {
				h[k] = v
			}
		}), reason: "free headers exceed"},
		{name: "key-not-utf8", headers: envelope("key-not-utf8", func(h map[string]string) { h[wire.HeaderKey] = "o\xff1" }), reason: wire.HeaderKey, badUTF8: true},
		{name: "free-header-not-utf8", headers: envelope("free-header-not-utf8", func(h map[string]string) { h[wire.HeaderFreePrefix+"x"] = "\xfe\xff" }), reason: "not UTF-8", badUTF8: true},
		{name: "year-9999", headers: envelope("year-9999", func(h map[string]string) {
			h[wire.HeaderDeliverAt] = fmt.Sprint(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
		}), reason: "too far"},
		// Header types only a protocol with typed headers (AMQP) can send.
		{name: "due-as-number", values: values("due-as-number", func(h map[string]any) { h[wire.HeaderDeliverAt] = time.Now().UnixMilli() }), reason: wire.HeaderDeliverAt},
		{name: "key-as-number", values: values("key-as-number", func(h map[string]any) { h[wire.HeaderKey] = int32(42) }), reason: wire.HeaderKey},
		{name: "version-as-bool", values: values("version-as-bool", func(h map[string]any) { h[wire.HeaderVersion] = true }), reason: wire.HeaderVersion},
		{name: "topic-as-bytes", values: values("topic-as-bytes", func(h map[string]any) { h[wire.HeaderTopic] = []byte(topic) }), reason: wire.HeaderTopic},
		{name: "hop-as-table", values: values("hop-as-table", func(h map[string]any) { h[wire.HeaderHop] = map[string]any{"n": int32(1)} }), reason: wire.HeaderHop},
		{name: "no-envelope-typed", values: map[string]any{"x-n": int64(5), "x-list": []any{int32(1), "a"}}, reason: "no delaybridge envelope"},
		// A good envelope next to foreign headers of every type is handled:
		// headers outside the envelope are not the runtime's business.
		{name: "odd-foreign-headers", values: values("odd-foreign-headers", func(h map[string]any) {
			h["x-n"], h["x-f"], h["x-b"], h["x-bytes"] = int64(5), 1.5, true, []byte{0xff, 0}
			h["x-table"], h["x-list"], h["x-time"] = map[string]any{"a": "b"}, []any{int32(1), "a"}, time.Unix(1_700_000_000, 0)
		})},
	}
}

// testForeign sends the foreign messages of foreignCases, then a valid one,
// to a consumer with one worker that dead-letters to a real dead topic: each
// foreign message must reach the dead topic with a readable reason (or be
// refused by the broker itself, or, when it is valid after all, be handled)
// and the valid one must be handled after them.
func testForeign(t *testing.T, h Harness) {
	topic := Topic(t)
	deadTopic := topic + "-dead"

	var mu sync.Mutex
	dead := map[string]*broker.Message{} // by payload
	handled := map[string]*broker.Message{}
	changed := make(chan struct{}, 1)
	note := func(into map[string]*broker.Message, m *broker.Message) {
		mu.Lock()
		into[string(m.Payload)] = m
		mu.Unlock()
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	noDeadOfDead := broker.DeadLetterFunc(func(_ context.Context, d *broker.Delivery, reason error) error {
		t.Errorf("a dead letter could not be read back from the dead topic: %v", reason)
		return nil
	})
	_, deadPub := startConsumer(t, h, deadTopic, func(_ context.Context, m *broker.Message) error {
		note(dead, m)
		return nil
	}, noDeadOfDead, broker.ConsumerConfig{})
	_, pub := startConsumer(t, h, topic, func(_ context.Context, m *broker.Message) error {
		note(handled, m)
		return nil
	}, broker.PublishDead(deadPub, deadTopic), broker.ConsumerConfig{Concurrency: 1})

	var sent []foreignCase
	for _, c := range foreignCases(topic) {
		body := []byte("foreign-" + c.name)
		var err error
		switch {
		case c.values != nil && h.PublishRawValues == nil:
			continue
		case c.values != nil:
			err = h.PublishRawValues(t, topic, c.values, body)
		default:
			err = h.PublishRaw(t, topic, c.headers, body)
		}
		if err != nil {
			// The broker refused it: it never reaches a consumer, which is
			// as good as dead for this test.
			t.Logf("%s: the broker refused the message: %v", c.name, err)
			continue
		}
		if c.badUTF8 && h.Features.HeadersAlwaysUTF8 {
			c.reason = ""
		}
		sent = append(sent, c)
	}
	good := message(topic, "good-after-foreign", time.Now())
	good.Payload = []byte("good-after-foreign")
	publish(t, pub, good)

	settled := func() (missing []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range append(sent, foreignCase{name: "good-after-foreign"}) {
			p := "foreign-" + c.name
			if c.name == "good-after-foreign" {
				p = c.name
			}
			if dead[p] == nil && handled[p] == nil {
				missing = append(missing, c.name)
			}
		}
		return missing
	}
	deadline := time.After(30*time.Second + 3*h.Features.LateBound)
	for missing := settled(); len(missing) > 0; missing = settled() {
		select {
		case <-deadline:
			t.Fatalf("neither handled nor in the dead topic: %v", missing)
		case <-changed:
		case <-time.After(100 * time.Millisecond):
		}
	}

	mu.Lock()
	defer mu.Unlock()
	if handled["good-after-foreign"] == nil {
		t.Errorf("the valid message went dead: %v", dead["good-after-foreign"].Headers[broker.DeadHeaderReason])
	}
	for _, c := range sent {
		p := "foreign-" + c.name
		d, hd := dead[p], handled[p]
		if c.reason == "" {
			if hd == nil {
				t.Errorf("%s: went dead (%s), want handled", c.name, d.Headers[broker.DeadHeaderReason])
			} else if c.badUTF8 && !utf8.ValidString(hd.Key) {
				t.Errorf("%s: handled with a key that is not UTF-8: %q", c.name, hd.Key)
			}
			continue
		}
		if d == nil {
			t.Errorf("%s: handled, want dead with a reason containing %q", c.name, c.reason)
			continue
		}
		r := d.Headers[broker.DeadHeaderReason]
		if !strings.Contains(r, c.reason) || len(r) > 1024 {
			t.Errorf("%s: dead reason %q, want a short one containing %q", c.name, r, c.reason)
		}
		if c.name == "year-9999" {
			if d.Key != "foreign-year-9999" || d.Headers[broker.DeadHeaderTopic] != topic {
				t.Errorf("%s: the dead message lost its key or topic: key %q, headers %v", c.name, d.Key, d.Headers)
			}
		} else if d.Key != "malformed" {
			t.Errorf("%s: dead key %q, want malformed", c.name, d.Key)
		}
	}
	if d := dead["foreign-no-envelope"]; d != nil && d.Headers[broker.DeadHeaderOrig+"content-type"] != "text/plain" {
		t.Errorf("the dead message of a foreign one lost its headers: %v", d.Headers)
	}
}

// testPanicAndStuck runs a handler that panics on one message and one that
// hangs, ignoring its context, on another, with one worker: both go dead
// after their attempts, and a message behind them is handled.
func testPanicAndStuck(t *testing.T, h Harness) {
	topic := Topic(t)
	r := newRecorder()
	release := make(chan struct{})
	var mu sync.Mutex
	runs := map[string]int{}
	handler := func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		runs[m.Key]++
		mu.Unlock()
		switch m.Key {
		case "panics":
			panic("handler bug: index out of range")
		case "hangs":
			<-release // deaf to ctx, like a call without a deadline
			return nil
		}
		return r.handle(ctx, m)
	}
	cfg := broker.ConsumerConfig{
		Concurrency:    1,
		MaxAttempts:    2,
		HandlerTimeout: 200 * time.Millisecond,
		HandlerGrace:   200 * time.Millisecond,
		Backoff:        broker.Backoff{Initial: 100 * time.Millisecond, Max: 200 * time.Millisecond, Multiplier: 2, Jitter: 0.1},
	}
	c, pub := startConsumer(t, h, topic, handler, r, cfg)
	// Let the abandoned handlers go before the consumer is closed (cleanups
	// run last registered first), so Close has nothing left to wait for.
	t.Cleanup(func() { close(release) })
	publish(t, pub, message(topic, "panics", time.Now()), message(topic, "hangs", time.Now()))
	publish(t, pub, message(topic, "after", time.Now()))
	r.waitFor(t, 30*time.Second+3*h.Features.LateBound, "both poison messages dead and the one behind them handled", func() bool {
		return r.dead["panics"] != nil && r.dead["hangs"] != nil && len(r.handled["after"]) > 0
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.dead["panics"]; !strings.Contains(err.Error(), "handler panicked: handler bug") {
		t.Errorf("panics: dead reason %v does not say the handler panicked", err)
	}
	if err := r.dead["hangs"]; !errors.Is(err, broker.ErrHandlerStuck) {
		t.Errorf("hangs: dead reason %v, want ErrHandlerStuck", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs["panics"] != 2 || runs["hangs"] != 2 {
		t.Errorf("handler runs %v, want 2 attempts each for panics and hangs", runs)
	}
	if n := c.Stuck(); n != 2 {
		t.Errorf("Stuck() = %d, want the 2 abandoned runs of hangs", n)
	}
}
