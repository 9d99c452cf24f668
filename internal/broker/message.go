package broker

import (
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"maps"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/internal/wire"
)

// Size limits for what a Message may carry. They are far above what a task
// needs and well under what either broker accepts, so a message that passes
// them never fails on size alone.
const (
	// MaxTopicLen is the longest topic name.
	MaxTopicLen = 127
	// MaxKeyLen is the longest business key, in bytes.
	MaxKeyLen = 255
	// MaxTraceLen is the longest trace context, in bytes.
	MaxTraceLen = 512
	// MaxHeaderBytes bounds the free headers of one message as they travel:
	// for each header its name with the envelope prefix (wire.HeaderFreePrefix),
	// its value and two separator bytes (see HeaderBytes). With the envelope
	// this stays under the 32 KiB RocketMQ allows for all properties.
	MaxHeaderBytes = 16 << 10
)

// separators are the bytes RocketMQ's property format uses between a name
// and its value (\x01) and between properties (\x02). RocketMQ cannot carry
// them in a key, trace or header, and every message must be able to travel
// through either broker, so no message may hold them there.
const separators = "\x01\x02"

// HeaderBytes is what one free header counts against MaxHeaderBytes: what
// it takes on the wire in the most compact broker format.
func HeaderBytes(name, value string) int {
	return len(wire.HeaderFreePrefix) + len(name) + len(value) + 2
}

// Message is one delayed task on its way through a broker. The adapters carry
// every field except Payload in the envelope (see Encode); Payload is the body.
type Message struct {
	// TaskID is the outbox row the message came from, or 0 when it was
	// published without an outbox.
	TaskID int64
	// Topic is the logical destination, [A-Za-z0-9_-]{1,127}.
	Topic string
	// Key is the business key, such as an order number. It is never empty.
	Key string
	// Payload is the opaque body handed to the handler.
	Payload []byte
	// DeliverAt is the earliest time the handler may run, in UTC with
	// millisecond precision. A retry moves it to the time of the next attempt.
	DeliverAt time.Time
	// Hop counts the re-publishes of this attempt on the way to DeliverAt:
	// 0 for the first publish, one more for each further hop.
	Hop int
	// Attempt counts failed handler runs: 0 until the handler first fails.
	// A Handler that keeps its own count may set it on the message it is
	// given; the runtime then decides retry or dead by that count, not by
	// the one the message arrived with. outbox.Handle sets the task row's,
	// so a forged message cannot spend or restore a task's attempts.
	Attempt int
	// Rerun is true when the handler already ran for this attempt in a
	// transaction that was rolled back: a group in which another message
	// failed. Work the handler did outside that transaction (an HTTP call,
	// an e-mail) may have happened already. It does not travel through the
	// broker.
	Rerun bool
	// Generation is the task's generation when the message was published;
	// rescheduling a task bumps it so older messages are skipped.
	Generation int64
	// Trace is an opaque trace context (a W3C traceparent, for example).
	Trace string
	// Headers are free string headers that travel with the message.
	Headers map[string]string

	// span is the consumer runtime's span of this delivery while the
	// handler runs (tracing on); it does not travel.
	span trace.Span
}

// MaxTrackedTopics bounds the per-topic state an adapter keeps (topics
// declared, routes seen): past it, the state is dropped and rebuilt as
// needed, so a producer naming ever new topics cannot grow a process
// without end.
const MaxTrackedTopics = 10_000

// MaxBody is the largest message body a subscriber hands to the runtime:
// RocketMQ's default body limit, above the outbox's largest payload. A
// bigger delivery is malformed (it was not published by delaybridge) and
// goes to dead without reaching a handler.
const MaxBody = 4 << 20

// Clone returns a deep copy of m, so a re-publish never shares maps or
// slices with the delivery it came from.
func (m *Message) Clone() *Message {
	c := *m
	c.Payload = append([]byte(nil), m.Payload...)
	c.Headers = maps.Clone(m.Headers)
	return &c
}

// Validate reports the first field of m that no broker would carry faithfully.
func (m *Message) Validate() error {
	if err := ValidateTopic(m.Topic); err != nil {
		return err
	}
	if err := ValidateKey(m.Key); err != nil {
		return err
	}
	if m.DeliverAt.IsZero() {
		return fmt.Errorf("%w: deliver-at is zero", ErrInvalidMessage)
	}
	if err := CheckDeliverAt(m.DeliverAt); err != nil {
		return err
	}
	if m.Hop < 0 || m.Attempt < 0 || m.Generation < 0 {
		return fmt.Errorf("%w: negative hop, attempt or generation", ErrInvalidMessage)
	}
	if len(m.Trace) > MaxTraceLen || !utf8.ValidString(m.Trace) || strings.ContainsAny(m.Trace, separators) {
		return fmt.Errorf("%w: trace context longer than %d bytes, not UTF-8 or holding \\x01 or \\x02", ErrInvalidMessage, MaxTraceLen)
	}
	size := 0
	for k, v := range m.Headers {
		if k == "" || !utf8.ValidString(k) || !utf8.ValidString(v) || strings.ContainsAny(k, separators) || strings.ContainsAny(v, separators) {
			return fmt.Errorf("%w: header %.64q: names must be non-empty, names and values UTF-8 without \\x01 or \\x02", ErrInvalidMessage, k)
		}
		size += HeaderBytes(k, v)
	}
	if size > MaxHeaderBytes {
		return fmt.Errorf("%w: headers take %d bytes, more than %d", ErrInvalidMessage, size, MaxHeaderBytes)
	}
	return nil
}

// ValidateTopic reports whether topic is a name both brokers accept:
// 1 to 127 characters of [A-Za-z0-9_-].
func ValidateTopic(topic string) error {
	if topic == "" || len(topic) > MaxTopicLen {
		return fmt.Errorf("%w: %q must be 1 to %d characters", ErrInvalidTopic, topic, MaxTopicLen)
	}
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q has %q; only [A-Za-z0-9_-] is allowed", ErrInvalidTopic, topic, c)
		}
	}
	return nil
}

// ValidateKey reports whether key is a usable business key: non-empty,
// valid UTF-8, at most MaxKeyLen bytes and free of \x01 and \x02, which
// RocketMQ cannot carry in a property. Any other byte, NUL and quotes
// included, is allowed.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	case strings.ContainsAny(key, separators):
		return fmt.Errorf("%w: holds \\x01 or \\x02, which RocketMQ uses to separate properties", ErrInvalidKey)
	}
	return nil
}

// DueMillis is t in epoch milliseconds, rounded up: a due time stored
// this way is never before the instant the caller asked for, so a task
// never runs early by the part of a millisecond the column cannot hold.
func DueMillis(t time.Time) int64 {
	ms := t.UnixMilli()
	if t.After(time.UnixMilli(ms)) {
		ms++
	}
	return ms
}

// MillisUTC truncates t to the millisecond and returns it in UTC, the form
// DeliverAt always has once it crossed a broker, and the form an outbox
// task's DueAt has once read back (due times are stored in epoch
// milliseconds).
func MillisUTC(t time.Time) time.Time {
	return time.UnixMilli(t.UnixMilli()).UTC()
}
