package rabbit

import (
	"context"
	"testing"
	"time"
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
