package broker

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/internal/wire"
)

// Bounds on a due time, in Unix milliseconds (UTC by definition). Anything
// outside is a mistake, not a due time: Schedule refuses it, Message.Validate
// refuses it, and an envelope carrying it is malformed. One pair of bounds
// for all three, so no due time is accepted by one check and refused by
// another. The runtime's MaxDelay is much tighter than the upper bound.
const (
	minDeliverAtMS = 946_684_800_000     // 2000-01-01T00:00:00Z
	maxDeliverAtMS = 253_402_300_799_000 // 9999-12-31T23:59:59Z
)

// CheckDeliverAt reports a due time before 2000-01-01 UTC or after the end
// of 9999 UTC, wrapping ErrInvalidMessage. The time zone of t does not
// matter: the bound is one instant.
func CheckDeliverAt(t time.Time) error {
	if ms := t.UnixMilli(); ms < minDeliverAtMS || ms > maxDeliverAtMS {
		return fmt.Errorf("%w: deliver-at %s is outside 2000-01-01 .. 9999-12-31 UTC", ErrInvalidMessage, t.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// Encode returns the envelope headers of m. The body of the broker message is
// m.Payload, untouched. Encode does not validate; call m.Validate first.
func Encode(m *Message) map[string]string {
	h := make(map[string]string, 9+len(m.Headers))
	for k, v := range m.Headers {
		h[wire.HeaderFreePrefix+k] = v
	}
	h[wire.HeaderVersion] = wire.EnvelopeVersion
	h[wire.HeaderTopic] = m.Topic
	h[wire.HeaderKey] = m.Key
	h[wire.HeaderDeliverAt] = strconv.FormatInt(m.DeliverAt.UnixMilli(), 10)
	h[wire.HeaderHop] = strconv.Itoa(m.Hop)
	h[wire.HeaderAttempt] = strconv.Itoa(m.Attempt)
	h[wire.HeaderGeneration] = strconv.FormatInt(m.Generation, 10)
	if m.TaskID != 0 {
		h[wire.HeaderTaskID] = strconv.FormatInt(m.TaskID, 10)
	}
	if m.Trace != "" {
		h[wire.HeaderTrace] = m.Trace
	}
	return h
}

// Decode rebuilds a Message from the headers and body of a broker message.
// Headers outside the envelope (broker or foreign ones) are ignored. It
// returns ErrNoEnvelope when there is no envelope and an *EnvelopeError when
// a field is missing or malformed; it never panics on any input.
func Decode(headers map[string]string, body []byte) (*Message, error) {
	v, ok := headers[wire.HeaderVersion]
	if !ok {
		return nil, ErrNoEnvelope
	}
	if v != wire.EnvelopeVersion {
		return nil, &EnvelopeError{Header: wire.HeaderVersion, Reason: fmt.Sprintf("version %.16q, want %q", v, wire.EnvelopeVersion)}
	}
	if len(body) > MaxBody {
		return nil, &EnvelopeError{Header: "body", Reason: fmt.Sprintf("%d bytes, more than the %d any delaybridge message carries", len(body), MaxBody)}
	}
	m := &Message{Payload: body}
	var err error
	if m.Topic, err = required(headers, wire.HeaderTopic); err != nil {
		return nil, err
	}
	if e := ValidateTopic(m.Topic); e != nil {
		return nil, &EnvelopeError{Header: wire.HeaderTopic, Reason: e.Error()}
	}
	if m.Key, err = required(headers, wire.HeaderKey); err != nil {
		return nil, err
	}
	if e := ValidateKey(m.Key); e != nil {
		return nil, &EnvelopeError{Header: wire.HeaderKey, Reason: e.Error()}
	}
	ms, err := integer(headers, wire.HeaderDeliverAt, true, minDeliverAtMS, maxDeliverAtMS)
	if err != nil {
		return nil, err
	}
	m.DeliverAt = time.UnixMilli(ms).UTC()
	hop, err := integer(headers, wire.HeaderHop, true, 0, 1<<31-1)
	if err != nil {
		return nil, err
	}
	attempt, err := integer(headers, wire.HeaderAttempt, true, 0, 1<<31-1)
	if err != nil {
		return nil, err
	}
	m.Hop, m.Attempt = int(hop), int(attempt)
	if m.Generation, err = integer(headers, wire.HeaderGeneration, true, 0, 1<<63-1); err != nil {
		return nil, err
	}
	if m.TaskID, err = integer(headers, wire.HeaderTaskID, false, 1, 1<<63-1); err != nil {
		return nil, err
	}
	if tr, ok := headers[wire.HeaderTrace]; ok {
		if len(tr) > MaxTraceLen || !utf8.ValidString(tr) || strings.ContainsAny(tr, separators) {
			return nil, &EnvelopeError{Header: wire.HeaderTrace, Reason: fmt.Sprintf("longer than %d bytes, not UTF-8 or holding \\x01 or \\x02", MaxTraceLen)}
		}
		m.Trace = tr
	}
	size := 0
	for k, v := range headers {
		name, ok := strings.CutPrefix(k, wire.HeaderFreePrefix)
		if !ok {
			continue
		}
		if name == "" || !utf8.ValidString(name) || !utf8.ValidString(v) || strings.ContainsAny(k, separators) || strings.ContainsAny(v, separators) {
			return nil, &EnvelopeError{Header: fmt.Sprintf("%.64q", k), Reason: "free header name empty, or name or value not UTF-8 or holding \\x01 or \\x02"}
		}
		size += HeaderBytes(name, v)
		if size > MaxHeaderBytes {
			return nil, &EnvelopeError{Header: wire.HeaderFreePrefix + "*", Reason: fmt.Sprintf("free headers exceed %d bytes", MaxHeaderBytes)}
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string)
		}
		m.Headers[name] = v
	}
	return m, nil
}

func required(h map[string]string, name string) (string, error) {
	v, ok := h[name]
	if !ok {
		return "", &EnvelopeError{Header: name, Reason: "missing"}
	}
	return v, nil
}

// integer parses header name as a base-10 integer within [lo, hi]. When the
// header is absent it returns 0, or an error if must is set.
func integer(h map[string]string, name string, must bool, lo, hi int64) (int64, error) {
	v, ok := h[name]
	if !ok {
		if must {
			return 0, &EnvelopeError{Header: name, Reason: "missing"}
		}
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, &EnvelopeError{Header: name, Reason: fmt.Sprintf("%.32q is not an integer", v)}
	}
	if n < lo || n > hi {
		return 0, &EnvelopeError{Header: name, Reason: fmt.Sprintf("%d is outside [%d, %d]", n, lo, hi)}
	}
	return n, nil
}
