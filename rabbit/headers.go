package rabbit

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
)

// isDeathHeader reports the headers RabbitMQ adds when it dead-letters a
// message. They must never be published again: RabbitMQ 3.10 sees a message
// whose x-death already names the queue it is entering as a dead-letter
// cycle, and at-least-once dead-lettering then holds it forever.
func isDeathHeader(k string) bool {
	return k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-")
}

// envHeader carries the whole envelope (broker.Encode's headers) in one AMQP
// header, as a URL query of the names without their "delaybridge-" prefix:
//
//	delaybridge-env: attempt=0&deliver-at=1764500000000&gen=0&hop=0&key=o-42&task=17&topic=order-cancel&v=1
//
// RabbitMQ decodes every header of every publish, writes them to the
// quorum queue's log and decodes them again at each ladder hop: one header
// instead of eight or more takes it 6-13 µs less per message on the test
// box (BENCHMARKS.md). Readers also take the older form, one AMQP header per
// envelope field, so messages published by an older version still decode;
// a process older than this form finds no envelope in a packed message and
// dead-letters it, so while any runs, every newer one sets
// Config.SplitEnvelope.
const envHeader = "delaybridge-env"

// envelopeTable is the AMQP header table of m: its envelope packed into
// envHeader, or with split one header per field, with room for extra more
// entries (the ladder's marks, CC).
func envelopeTable(m *broker.Message, extra int, split bool) amqp.Table {
	h := broker.Encode(m)
	if split {
		t := make(amqp.Table, len(h)+extra)
		for k, v := range h {
			t[k] = v
		}
		return t
	}
	t := make(amqp.Table, 1+extra)
	t[envHeader] = packEnvelope(h)
	return t
}

// packEnvelope writes envelope headers, every name starting with
// broker.HeaderPrefix, as envHeader's value.
func packEnvelope(h map[string]string) string {
	q := make(url.Values, len(h))
	for k, v := range h {
		q[strings.TrimPrefix(k, broker.HeaderPrefix)] = []string{v}
	}
	return q.Encode()
}

// unpackEnvelope adds the fields of envHeader's value v to h under their
// full header names. A field given twice, or also carried as its own
// header, is an *broker.EnvelopeError: which one counts would be a guess.
func unpackEnvelope(v any, h map[string]string) error {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		return &broker.EnvelopeError{Header: envHeader, Reason: fmt.Sprintf("value of AMQP type %T, want a string", v)}
	}
	q, err := url.ParseQuery(s)
	if err != nil {
		return &broker.EnvelopeError{Header: envHeader, Reason: "not a URL query: " + err.Error()}
	}
	if _, ok := q[strings.TrimPrefix(broker.HeaderVersion, broker.HeaderPrefix)]; !ok {
		return &broker.EnvelopeError{Header: envHeader, Reason: "no envelope version field"}
	}
	for k, vs := range q {
		name := broker.HeaderPrefix + k
		if _, dup := h[name]; dup || len(vs) != 1 {
			return &broker.EnvelopeError{Header: envHeader, Reason: fmt.Sprintf("field %.64q given more than once", k)}
		}
		h[name] = vs[0]
	}
	return nil
}

// fromTable turns the headers of a delivery into strings, unpacking
// envHeader (a string or bytes). Separate envelope headers must be strings;
// one that is not makes an *broker.EnvelopeError. Other
// scalar headers are formatted; tables and arrays (x-death and the like),
// the dead-letter headers and the ladder's bit headers are left out.
func fromTable(t amqp.Table) (map[string]string, error) {
	h := make(map[string]string, len(t)+8)
	var bad error
	for k, v := range t {
		if isDeathHeader(k) || strings.HasPrefix(k, "dlbl-") {
			continue
		}
		if k == envHeader {
			continue // unpacked below, once the separate headers are in h
		}
		if s, ok := v.(string); ok {
			h[k] = s
			continue
		}
		if strings.HasPrefix(k, broker.HeaderPrefix) {
			if bad == nil {
				bad = &broker.EnvelopeError{Header: k, Reason: fmt.Sprintf("value of AMQP type %T, want a string", v)}
			}
			continue
		}
		switch v := v.(type) {
		case []byte:
			if utf8.Valid(v) {
				h[k] = string(v)
			}
		case bool:
			h[k] = strconv.FormatBool(v)
		case int8, int16, int32, int64, int, uint8, uint16, uint32, float32, float64:
			h[k] = fmt.Sprint(v)
		}
	}
	if packed, ok := t[envHeader]; ok && bad == nil {
		bad = unpackEnvelope(packed, h)
	}
	return h, bad
}
