package broker

import (
	"context"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// DefaultDeadTopic is where PublishDead sends messages by default.
const DefaultDeadTopic = "delaybridge-dead"

// Headers PublishDead adds to a dead message.
const (
	DeadHeaderReason = "dead-reason"
	DeadHeaderTopic  = "dead-topic"
	DeadHeaderOrig   = "dead-orig-" // prefix of the headers of an undecodable message
)

// maxReasonLen keeps a long error chain from crowding out the headers.
const maxReasonLen = 1024

// PublishDead returns a DeadLetter that publishes what the runtime gave up on
// to topic, due at once, with the reason and original topic as headers. A
// message that could not be decoded travels with its body as the payload,
// its original headers as far as they are valid UTF-8 and fit, and the key
// "malformed".
func PublishDead(pub Publisher, topic string) DeadLetter {
	return DeadLetterFunc(func(ctx context.Context, d *Delivery, reason error) error {
		if err := ValidateTopic(topic); err != nil {
			return err
		}
		m := DeadMessage(d, reason, topic)
		return pub.Publish(ctx, m)
	})
}

// DeadMessage builds the message PublishDead sends for d.
func DeadMessage(d *Delivery, reason error, topic string) *Message {
	var m *Message
	if d.Message != nil {
		m = d.Message.Clone()
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		m.Headers[DeadHeaderTopic] = m.Topic
		m.Headers["dead-attempt"] = strconv.Itoa(m.Attempt)
	} else {
		m = &Message{Key: "malformed", Payload: append([]byte(nil), d.Body...), Headers: map[string]string{}}
		size := 0
		for k, v := range d.Headers {
			if !utf8.ValidString(k) || !utf8.ValidString(v) || strings.HasPrefix(k, HeaderVersion) {
				continue
			}
			name := DeadHeaderOrig + k
			if size+len(name)+len(v) > MaxHeaderBytes/2 {
				continue
			}
			size += len(name) + len(v)
			m.Headers[name] = v
		}
	}
	r := "unknown"
	if reason != nil {
		r = reason.Error()
	}
	if len(r) > maxReasonLen {
		r = r[:maxReasonLen]
	}
	m.Headers[DeadHeaderReason] = strings.ToValidUTF8(r, "?")
	m.Topic = topic
	m.Hop = 0
	m.DeliverAt = MillisUTC(time.Now())
	return m
}
