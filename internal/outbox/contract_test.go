package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// insertRaw writes a task the way docs/table-contract.md tells a producer
// in another language to: one plain INSERT filling the required columns.
func (b *bundle) insertRaw(t *testing.T, topic string, key []byte, dueMS int64, generation int64, headers, trace any, state string) {
	t.Helper()
	now := time.Now().UnixMilli()
	if _, err := b.db.ExecContext(b.ctx, `INSERT INTO delay_task
  (topic, task_key, due_ms, payload, headers, trace, state, generation, created_ms, updated_ms)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, topic, key, dueMS, []byte("body of "+string(key)), headers, trace, state, generation, now, now); err != nil {
		t.Fatalf("insert %s/%q: %v", topic, key, err)
	}
}

// TestTableContract_BadRowsGoDeadWithAReasonAndBlockNothing inserts, with
// plain SQL, rows a producer in another language might get wrong, between
// good ones, and runs the relay once: every good row is published, every
// row no broker could carry is dead with its reason, a row with unreadable
// headers travels without them, and a row in an unknown state is left
// alone.
func TestTableContract_BadRowsGoDeadWithAReasonAndBlockNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	due := time.Now().Add(-time.Second).UnixMilli()
	b.insertRaw(t, "contract", []byte("good-1"), due, 0, nil, nil, "pending")
	bad := map[string]struct {
		topic  string
		dueMS  int64
		gen    int64
		trace  any
		reason string
	}{
		"seconds":   {"contract", due / 1000, 0, nil, "outside 2000-01-01"},
		"zero-due":  {"contract", 0, 0, nil, "outside 2000-01-01"},
		"micros":    {"contract", due * 1000, 0, nil, "outside 2000-01-01"},
		"bad-topic": {"orders.cancel", due, 0, nil, "invalid topic"},
		"negative":  {"contract", due, -1, nil, "negative hop, attempt or generation"},
		"bad-trace": {"contract", due, 0, "a\x02b", "trace context"},
		"separator": {"contract", due, 0, nil, "invalid key"},
		"not-utf8":  {"contract", due, 0, nil, "invalid key"},
		"empty-key": {"contract", due, 0, nil, "invalid key"},
	}
	keys := map[string][]byte{"separator": []byte("a\x01b"), "not-utf8": {0xff, 0xfe}, "empty-key": {}}
	for name, r := range bad {
		key, ok := keys[name]
		if !ok {
			key = []byte(name)
		}
		b.insertRaw(t, r.topic, key, r.dueMS, r.gen, nil, r.trace, "pending")
	}
	b.insertRaw(t, "contract", []byte("bad-headers"), due, 0, "not json", nil, "pending")
	b.insertRaw(t, "contract", []byte("upper-state"), due, 0, nil, nil, "PENDING")
	b.insertRaw(t, "contract", []byte("good-2"), due, 0, `{"tenant":"eu"}`, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "pending")

	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	n, err := newRelay(t, b, mem, outbox.RelayConfig{}).Once(b.ctx)
	if err != nil || n != len(bad)+3 {
		t.Fatalf("Once = %d, %v; want %d rows claimed", n, err, len(bad)+3)
	}
	for name, r := range bad {
		key, ok := keys[name]
		if !ok {
			key = []byte(name)
		}
		var state, lastErr string
		if err := b.db.QueryRow("SELECT state, last_error FROM delay_task WHERE task_key = ?", key).Scan(&state, &lastErr); err != nil {
			t.Fatal(name, err)
		}
		if state != "dead" || !strings.HasPrefix(lastErr, "invalid row: ") || !strings.Contains(lastErr, r.reason) {
			t.Errorf("%s: state %s, last_error %q; want dead, invalid row: … %s", name, state, lastErr, r.reason)
		}
	}
	if got := b.count(t, "state = 'published' AND task_key IN ('good-1', 'good-2', 'bad-headers')"); got != 3 {
		t.Fatalf("%d of the 3 carriable rows published", got)
	}
	if got := b.count(t, "task_key = 'upper-state' AND state = 'PENDING' AND publish_attempts = 0"); got != 1 {
		t.Fatal("a row in an unknown state was touched")
	}

	// The good rows' messages carry what the row said and are handled.
	// Handling them is database work under the subscription's context, so
	// it is generous; when it ends the channel closes.
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	ch, err := mem.Subscribe(ctx, "contract")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < 3 {
		d := <-ch
		if d == nil {
			t.Fatalf("the subscription ended after %d of the 3 good rows' messages", len(seen))
		}
		if d.Err != nil {
			t.Fatalf("delivery %+v", d)
		}
		m := d.Message
		seen[m.Key] = true
		switch m.Key {
		case "good-2":
			if m.Headers["tenant"] != "eu" || !strings.HasPrefix(m.Trace, "00-0af7") || string(m.Payload) != "body of good-2" {
				t.Fatalf("good-2 travelled as %+v", m)
			}
		case "bad-headers":
			if len(m.Headers) != 0 {
				t.Fatalf("unreadable headers travelled: %v", m.Headers)
			}
		}
		if m.Generation != 0 || !m.DeliverAt.Equal(time.UnixMilli(due).UTC()) {
			t.Fatalf("%s: generation %d, deliver-at %v", m.Key, m.Generation, m.DeliverAt)
		}
		o, err := outbox.Handle(b.ctx, b.db, m, func(context.Context, *sql.Tx) error { return nil })
		if err != nil || o != outbox.Handled {
			t.Fatalf("handling %s: %v, %v", m.Key, o, err)
		}
		_ = d.Acker.Ack()
	}
}
