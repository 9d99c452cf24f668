package broker_test

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/memory"
	"github.com/delaybridge/delaybridge/internal/broker"
)

func testKey(id string, fill byte) broker.Key {
	return broker.Key{ID: id, Secret: []byte(strings.Repeat(string(fill), 32))}
}

// Every field of a message is covered: changing any one of them after
// signing makes the delivery forged.
func TestVerified_RefusesUnsignedTamperedAndUnknownKeyMessages(t *testing.T) {
	t.Parallel()
	old, cur := testKey("old", 'a'), testKey("new", 'b')
	base := func() *broker.Message {
		return &broker.Message{TaskID: 7, Topic: "orders", Key: "o-1", DeliverAt: broker.MillisUTC(time.Now()), Generation: 2,
			Trace: "tr", Headers: map[string]string{"tenant": "acme"}, Payload: []byte("p")}
	}
	for _, c := range []struct {
		name   string
		signer *broker.Key // nil: unsigned
		tamper func(m *broker.Message)
		ok     bool
	}{
		{"signed by the current key", &cur, nil, true},
		{"signed by the old key still accepted", &old, nil, true},
		{"unsigned", nil, nil, false},
		{"unknown key", ptr(testKey("gone", 'c')), nil, false},
		{"task id changed", &cur, func(m *broker.Message) { m.TaskID = 8 }, false},
		{"due time changed", &cur, func(m *broker.Message) { m.DeliverAt = m.DeliverAt.Add(-time.Hour) }, false},
		{"attempt changed", &cur, func(m *broker.Message) { m.Attempt = 9 }, false},
		{"generation changed", &cur, func(m *broker.Message) { m.Generation = 0 }, false},
		{"header added", &cur, func(m *broker.Message) { m.Headers["x"] = "y" }, false},
		{"payload changed", &cur, func(m *broker.Message) { m.Payload = []byte("q") }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			mem := memory.New(memory.Config{})
			t.Cleanup(func() { _ = mem.Close() })
			m := base()
			var pub broker.Publisher = mem
			if c.tamper != nil {
				pub = tamperingPublisher{pub: mem, f: c.tamper}
			}
			if c.signer != nil {
				pub = broker.Signed(pub, broker.Keyring{*c.signer})
			}
			if err := pub.Publish(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			ch, err := broker.Verified(mem, broker.Keyring{cur, old}).Subscribe(ctx, "orders")
			if err != nil {
				t.Fatal(err)
			}
			d := <-ch
			if c.ok {
				if d.Err != nil || d.Message.Headers[broker.SignatureHeader] != "" || d.Message.Headers["tenant"] != "acme" {
					t.Fatalf("valid message: err %v, headers %v", d.Err, d.Message.Headers)
				}
			} else if !errors.Is(d.Err, broker.ErrForged) {
				t.Fatalf("err = %v, want ErrForged", d.Err)
			}
			_ = d.Acker.Ack()
		})
	}
}

func ptr[T any](v T) *T { return &v }

// tamperingPublisher changes a message after it was signed, as someone
// between the relay and the consumer would.
type tamperingPublisher struct {
	pub broker.Publisher
	f   func(m *broker.Message)
}

func (p tamperingPublisher) Limits() broker.Limits { return p.pub.Limits() }
func (p tamperingPublisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	for _, m := range msgs {
		p.f(m)
	}
	return p.pub.Publish(ctx, msgs...)
}

// The consumer refuses a forged message without running it, and its own
// hops, signed by its publisher, pass.
func TestConsumer_ForgedMessageGoesDeadAndSignedHopsPass(t *testing.T) {
	t.Parallel()
	bd := setup(t, memory.Config{Limits: broker.Limits{MaxHop: 100 * time.Millisecond}})
	ring := broker.Keyring{testKey("k1", 'z')}
	var ran atomic.Int64
	c, err := broker.NewConsumer(broker.Verified(bd.b, ring), broker.Signed(bd.b, ring), func(ctx context.Context, m *broker.Message) error {
		ran.Add(1)
		return nil
	}, broker.ConsumerConfig{DeadLetter: bd.dead, Logger: quiet(), HoldWindow: 50 * time.Millisecond})
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
	bd.publish(t, "forged", time.Now())
	if err := broker.Signed(bd.b, ring).Publish(context.Background(), &broker.Message{Topic: bd.topic, Key: "real", DeliverAt: broker.MillisUTC(time.Now().Add(400 * time.Millisecond))}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the real message handled after its hops", func() bool { return ran.Load() == 1 })
	eventually(t, "the forged message dead", func() bool { return bd.dead.get("forged") != nil })
	if err := bd.dead.get("forged"); !errors.Is(err, broker.ErrForged) || ran.Load() != 1 {
		t.Fatalf("forged: dead reason %v, handler runs %d", err, ran.Load())
	}
}

// An entry written the wrong way round, secret first, is refused by its
// position, and no error shows any part of the secret.
func TestParseKeyring_ReversedEntryNeverShowsTheSecret(t *testing.T) {
	t.Parallel()
	good := "k1:" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("g", 32)))
	for _, secret := range []string{
		base64.StdEncoding.EncodeToString([]byte(strings.Repeat("\xfbS", 16))), // holds '+' or '/'
		base64.RawURLEncoding.EncodeToString([]byte(strings.Repeat("s", 48))),  // 64 plain characters
	} {
		for _, id := range []string{"k2", "key2"} { // "key2" is base64 too
			_, err := broker.ParseKeyring(good + "," + secret + ":" + id)
			if err == nil || !strings.Contains(err.Error(), "signing key 2:") {
				t.Errorf("reversed entry %q: %v, want an error naming signing key 2", id, err)
				continue
			}
			if strings.Contains(err.Error(), secret[:8]) {
				t.Errorf("the error shows the secret: %v", err)
			}
		}
	}
}

func TestParseKeyring_RefusesWhatCannotSign(t *testing.T) {
	t.Parallel()
	secret := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("s", 32)))
	ring, err := broker.ParseKeyring("new:" + secret + ", old:" + secret)
	if err != nil || len(ring) != 2 || ring[0].ID != "new" {
		t.Fatalf("ParseKeyring = %v, %v", ring, err)
	}
	for _, bad := range []string{"", "nocolon", "k:not base64!", "k:" + base64.StdEncoding.EncodeToString([]byte("short")), "a:" + secret + ",a:" + secret, "bad.id:" + secret} {
		if _, err := broker.ParseKeyring(bad); err == nil {
			t.Errorf("ParseKeyring(%q) accepted", bad)
		}
	}
}
