package outbox_test

import (
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// With MaxTopics 2, rows of a third topic go dead with the reason, and no
// queue is declared for it; the two admitted topics stay admitted for the
// rows that come after.
func TestRelay_MaxTopicsSendsRowsOfATopicPastItDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rmq := newInputsRabbit(t)
	now := time.Now()
	// Oldest due first: the relay meets alpha, then beta, then gamma.
	for i, topic := range []string{"alpha", "beta", "gamma"} {
		due := now.Add(time.Duration(i-10) * time.Second)
		b.insertPayload(t, topic, "k1", []byte("1"), due, "pending")
		b.insertPayload(t, topic, "k2", []byte("2"), due.Add(time.Millisecond), "pending")
	}
	r := newRelay(t, b, rmq.pub, outbox.RelayConfig{MaxTopics: 2})
	if n, err := r.Once(b.ctx); err != nil || n != 6 {
		t.Fatalf("Once = %d, %v; want 6 rows claimed", n, err)
	}
	for _, key := range []string{"k1", "k2"} {
		state, lastErr := b.lastError(t, "gamma", key)
		if state != "dead" || !strings.HasPrefix(lastErr, `topic refused: "gamma" is past the 2 topics`) {
			t.Errorf("gamma/%s is %s with %q; want dead, topic refused", key, state, lastErr)
		}
	}
	if got := b.count(t, "topic IN ('alpha', 'beta') AND state = 'published'"); got != 4 {
		t.Fatalf("%d of the 4 rows of the admitted topics are published", got)
	}
	if rmq.declared(t, "gamma") {
		t.Fatal("a queue was declared for the topic past MaxTopics")
	}
	if !rmq.declared(t, "alpha") || !rmq.declared(t, "beta") {
		t.Fatal("the admitted topics' queues are missing")
	}
	// Later rows: an admitted topic still goes out, the refused one not.
	b.insertPayload(t, "beta", "k3", []byte("3"), now.Add(-time.Second), "pending")
	b.insertPayload(t, "gamma", "k3", []byte("3"), now.Add(-time.Second), "pending")
	if n, err := r.Once(b.ctx); err != nil || n != 2 {
		t.Fatalf("second Once = %d, %v; want 2 rows claimed", n, err)
	}
	if state, _ := b.lastError(t, "beta", "k3"); state != "published" {
		t.Fatalf("a later row of an admitted topic is %s, want published", state)
	}
	if state, _ := b.lastError(t, "gamma", "k3"); state != "dead" || rmq.declared(t, "gamma") {
		t.Fatalf("a later row of the refused topic is %s (queue declared %v), want dead and none", state, rmq.declared(t, "gamma"))
	}
}

// With an allow-list, rows of any other topic go dead with the reason and
// no queue is declared for it, however few topics there are.
func TestRelay_TopicsAllowListSendsRowsOfOtherTopicsDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rmq := newInputsRabbit(t)
	due := time.Now().Add(-time.Second)
	for _, topic := range []string{"orders", "stray", "mail"} {
		b.insertPayload(t, topic, "k", []byte("x"), due, "pending")
	}
	if n, err := newRelay(t, b, rmq.pub, outbox.RelayConfig{Topics: []string{"orders", "mail"}, MaxTopics: 1}).Once(b.ctx); err != nil || n != 3 {
		t.Fatalf("Once = %d, %v; want 3 rows claimed", n, err)
	}
	state, lastErr := b.lastError(t, "stray", "k")
	if state != "dead" || !strings.HasPrefix(lastErr, `topic refused: "stray" is not one of the relay's topics`) {
		t.Fatalf("stray/k is %s with %q; want dead, topic refused", state, lastErr)
	}
	if rmq.declared(t, "stray") {
		t.Fatal("a queue was declared for a topic outside the allow-list")
	}
	// The list is the bound: MaxTopics 1 does not cut it.
	if got := b.count(t, "topic IN ('orders', 'mail') AND state = 'published'"); got != 2 || !rmq.declared(t, "orders") || !rmq.declared(t, "mail") {
		t.Fatalf("%d of the 2 allowed rows are published; want both, in declared queues", got)
	}
}

// An allow-list naming a topic no broker takes is refused before the relay
// starts, rather than sending every row dead.
func TestRelayConfig_RefusesAnAllowListTopicNoBrokerTakes(t *testing.T) {
	t.Parallel()
	err := outbox.RelayConfig{Topics: []string{"orders", "mail.fast"}}.Check(broker.Limits{})
	if err == nil || !strings.Contains(err.Error(), "mail.fast") {
		t.Fatalf("Check = %v; want the topic with a '.' refused by name", err)
	}
}
