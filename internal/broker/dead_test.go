package broker_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
)

func TestDeadMessage_ReasonWithBinaryIsEscapedAndCut(t *testing.T) {
	t.Parallel()
	d := &broker.Delivery{Message: sampleMessage()}
	reason := fmt.Errorf("cannot parse payload %q... raw: %s", "x", "\x00\x01\x02\x1b[31m\xff"+strings.Repeat("é", 2000))
	m := broker.DeadMessage(d, reason, "dead")
	if err := m.Validate(); err != nil {
		t.Fatalf("dead message invalid: %v", err)
	}
	r := m.Headers[broker.DeadHeaderReason]
	if !strings.HasPrefix(r, `cannot parse payload "x"... raw: \x00\x01\x02\x1b[31m?`) {
		t.Fatalf("reason %.80q: control characters not escaped", r)
	}
	if len(r) > 1024 {
		t.Fatalf("reason of %d bytes, want at most 1024", len(r))
	}
	if m.Key != d.Message.Key || m.Headers[broker.DeadHeaderTopic] != d.Message.Topic || m.Headers[broker.DeadHeaderAttempt] != "1" || m.Headers["tenant"] != "acme" {
		t.Fatalf("dead message lost what it came from: %+v", m)
	}
}

func TestDeadMessage_FullHeadersStillLeaveRoomForTheReason(t *testing.T) {
	t.Parallel()
	m := sampleMessage()
	m.Headers = map[string]string{}
	for size := 0; size+broker.HeaderBytes("h00000", "v") <= broker.MaxHeaderBytes-200; size += broker.HeaderBytes("h00000", "v") {
		m.Headers[fmt.Sprintf("h%05d", len(m.Headers))] = "v"
	}
	m.Headers["big"] = strings.Repeat("b", 100)
	if err := m.Validate(); err != nil {
		t.Fatalf("precondition: the message itself is valid: %v", err)
	}
	dead := broker.DeadMessage(&broker.Delivery{Message: m}, errors.New(strings.Repeat("r", 5000)), "dead")
	if err := dead.Validate(); err != nil {
		t.Fatalf("dead message of a message with full headers is invalid, so it could never be published: %v", err)
	}
	if dead.Headers[broker.DeadHeaderReason] == "" || dead.Headers[broker.DeadHeaderTopic] != m.Topic {
		t.Fatal("the reason or topic was dropped to make room")
	}
	if _, ok := dead.Headers["big"]; ok {
		t.Fatal("the largest original header was kept ahead of smaller ones")
	}
}

func TestDeadMessage_ForeignDeliveryKeepsWhatFitsAndIsValid(t *testing.T) {
	t.Parallel()
	h := map[string]string{
		"content-type": "text/plain",
		"bad-utf8":     "\xff",
		"control":      "a\x01b",
		"huge":         strings.Repeat("x", 64<<10),
		"multi-line":   "a\tb\nc",
	}
	for i := 0; i < 100; i++ {
		h[fmt.Sprintf("many-%04d", i)] = "v"
	}
	d := &broker.Delivery{Err: broker.ErrNoEnvelope, Headers: h, Body: []byte("not ours")}
	m := broker.DeadMessage(d, d.Err, "dead")
	if err := m.Validate(); err != nil {
		t.Fatalf("dead message invalid: %v", err)
	}
	if string(m.Payload) != "not ours" || m.Key != "malformed" || !strings.Contains(m.Headers[broker.DeadHeaderReason], "no delaybridge envelope") {
		t.Fatalf("dead message %+v", m)
	}
	if m.Headers["dead-orig-content-type"] != "text/plain" || m.Headers["dead-orig-multi-line"] != "a\tb\nc" || m.Headers["dead-orig-many-0099"] != "v" {
		t.Fatalf("small readable headers dropped: %v", m.Headers)
	}
	for _, k := range []string{"dead-orig-bad-utf8", "dead-orig-control", "dead-orig-huge"} {
		if _, ok := m.Headers[k]; ok {
			t.Errorf("%s kept", k)
		}
	}
}

// FuzzDeadMessage checks that whatever a foreign producer sent and whatever
// an error says, the dead message is valid, so a dead letter is never
// refused and redelivered forever.
func FuzzDeadMessage(f *testing.F) {
	f.Add("content-type", "text/plain", "no envelope", []byte("body"), false)
	f.Add("delaybridge-v", "1", "\x00\x01\x02\xff", []byte{}, true)
	f.Add("", "\xfe", strings.Repeat("\u2028", 600), []byte(nil), true)
	f.Fuzz(func(t *testing.T, name, value, reason string, body []byte, decoded bool) {
		d := &broker.Delivery{Headers: map[string]string{name: value, "x-" + value: name}, Body: body, Err: broker.ErrNoEnvelope}
		if decoded {
			m := sampleMessage()
			if m.Headers[name] = value; m.Validate() != nil {
				delete(m.Headers, name)
			}
			d = &broker.Delivery{Message: m}
		}
		dead := broker.DeadMessage(d, errors.New(reason), "dead")
		if err := dead.Validate(); err != nil {
			t.Fatalf("DeadMessage built an invalid message: %v", err)
		}
		if dead.Headers[broker.DeadHeaderReason] == "" && reason != "" {
			t.Fatal("the reason was lost")
		}
		if dead.DeliverAt.After(time.Now()) || dead.Topic != "dead" {
			t.Fatalf("dead message due %v on %q", dead.DeliverAt, dead.Topic)
		}
	})
}
