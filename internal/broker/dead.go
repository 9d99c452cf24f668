package broker

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/internal/wire"
)

// DefaultDeadTopic is where PublishDead sends messages by default.
const DefaultDeadTopic = "delaybridge-dead"

// Headers PublishDead adds to a dead message.
const (
	DeadHeaderReason = "dead-reason"
	DeadHeaderTopic  = "dead-topic"
	// DeadHeaderAttempt is the attempt the message was on when it died.
	DeadHeaderAttempt = "dead-attempt"
	DeadHeaderOrig    = "dead-orig-" // prefix of the headers of an undecodable message
	// DeadHeaderTruncated is set, to the original size in bytes, when the
	// payload was cut to the first 64 KiB.
	DeadHeaderTruncated = "dead-truncated"
)

// maxReasonLen keeps a long error chain from crowding out the headers.
const maxReasonLen = 1024

// maxDeadPayload bounds the payload of a dead message: enough to tell what
// it was, and a dead topic nobody reads cannot fill a broker with copies
// of the largest bodies.
const maxDeadPayload = 64 << 10

// PublishDead returns a DeadLetter that publishes what the runtime gave up on
// to topic, due at once, with the reason and original topic as headers (see
// DeadMessage).
func PublishDead(pub Publisher, topic string) DeadLetter {
	return DeadLetterFunc(func(ctx context.Context, d *Delivery, reason error) error {
		if err := ValidateTopic(topic); err != nil {
			return err
		}
		m := DeadMessage(d, reason, topic)
		return pub.Publish(ctx, m)
	})
}

// DeadMessage builds the message PublishDead sends for d. It always passes
// Validate, whatever d and reason hold, so a dead letter can never be
// refused and come back forever: the reason is cut to 1 KiB with control
// characters escaped, and the original headers are kept only as far as
// they fit next to it.
//
// A decoded message keeps its key, payload, trace and free headers, and
// gains the reason, its topic and its attempt. A message that could not be
// decoded travels with its body as the payload, the key "malformed", and
// its broker headers (prefixed DeadHeaderOrig) as far as they are valid
// UTF-8, free of control characters and fit in half of MaxHeaderBytes.
// Either payload is cut to its first 64 KiB, DeadHeaderTruncated then
// giving the size it had.
func DeadMessage(d *Delivery, reason error, topic string) *Message {
	r := "unknown"
	if reason != nil {
		r = reason.Error()
	}
	r = escapeControl(strings.ToValidUTF8(r, "?"))
	if len(r) > maxReasonLen {
		r = strings.ToValidUTF8(r[:maxReasonLen], "")
	}
	dead := map[string]string{DeadHeaderReason: r}
	var m *Message
	var orig map[string]string
	budget := MaxHeaderBytes
	if d.Message != nil {
		m = d.Message.Clone()
		orig = m.Headers
		dead[DeadHeaderTopic] = m.Topic
		dead[DeadHeaderAttempt] = strconv.Itoa(m.Attempt)
	} else {
		m = &Message{Key: "malformed", Payload: d.Body}
		budget = MaxHeaderBytes / 2
		orig = map[string]string{}
		for k, v := range d.Headers {
			if !strings.HasPrefix(k, wire.HeaderVersion) && printable(k) && printable(v) {
				orig[DeadHeaderOrig+k] = v
			}
		}
	}
	if n := len(m.Payload); n > maxDeadPayload {
		dead[DeadHeaderTruncated] = strconv.Itoa(n)
	}
	m.Payload = append([]byte(nil), m.Payload[:min(len(m.Payload), maxDeadPayload)]...)
	m.Headers = make(map[string]string, len(orig)+len(dead))
	size := 0
	for k, v := range dead {
		m.Headers[k] = v
		size += HeaderBytes(k, v)
	}
	// Smallest first, so one huge header does not crowd out the rest; by
	// name among equals, so the choice does not depend on map order.
	names := make([]string, 0, len(orig))
	for k := range orig {
		if _, taken := dead[k]; !taken {
			names = append(names, k)
		}
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := HeaderBytes(names[i], orig[names[i]]), HeaderBytes(names[j], orig[names[j]])
		return a < b || a == b && names[i] < names[j]
	})
	for _, k := range names {
		n := HeaderBytes(k, orig[k])
		if size+n > budget {
			break
		}
		size += n
		m.Headers[k] = orig[k]
	}
	m.Topic = topic
	m.Hop = 0
	m.DeliverAt = MillisUTC(time.Now())
	return m
}

// printable reports whether s can be kept as a dead header as it is: valid
// UTF-8 without control characters other than tab and newline.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if unicode.IsControl(c) && c != '\t' && c != '\n' {
			return false
		}
	}
	return true
}

// escapeControl writes each control character of s other than tab and
// newline as \xNN or \u{NNNN}, so an error text quoting binary data stays
// readable and legal in any broker's header.
func escapeControl(s string) string {
	if printable(s) {
		return s
	}
	var b strings.Builder
	for _, c := range s {
		switch {
		case !unicode.IsControl(c) || c == '\t' || c == '\n':
			b.WriteRune(c)
		case c < 0x100:
			fmt.Fprintf(&b, "\\x%02x", c)
		default:
			fmt.Fprintf(&b, "\\u{%04x}", c)
		}
	}
	return b.String()
}
