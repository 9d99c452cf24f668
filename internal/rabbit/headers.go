package rabbit

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/wire"
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
// quorum queue's log and decodes them again at each ladder hop, so one
// header instead of eight or more costs it less per message. It is the
// only form delaybridge writes or reads: an envelope field sent as its own
// AMQP header is malformed.
const envHeader = "delaybridge-env"

// envelopeTable is the AMQP header table of m: its envelope packed into
// envHeader, with room for extra more entries (the ladder's marks, CC).
func envelopeTable(m *broker.Message, extra int) amqp.Table {
	t := make(amqp.Table, 1+extra)
	t[envHeader] = packEnvelope(broker.Encode(m))
	return t
}

// packEnvelope writes envelope headers, every name starting with
// wire.HeaderPrefix, as envHeader's value.
func packEnvelope(h map[string]string) string {
	q := make(url.Values, len(h))
	for k, v := range h {
		q[strings.TrimPrefix(k, wire.HeaderPrefix)] = []string{v}
	}
	return q.Encode()
}

// unpackEnvelope adds the fields of envHeader's value v to h under their
// full header names. A field given twice is an *broker.EnvelopeError: which
// one counts would be a guess.
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
	if _, ok := q[strings.TrimPrefix(wire.HeaderVersion, wire.HeaderPrefix)]; !ok {
		return &broker.EnvelopeError{Header: envHeader, Reason: "no envelope version field"}
	}
	for k, vs := range q {
		if len(vs) != 1 {
			return &broker.EnvelopeError{Header: envHeader, Reason: fmt.Sprintf("field %.64q given more than once", k)}
		}
		h[wire.HeaderPrefix+k] = vs[0]
	}
	return nil
}

// fromTable turns the headers of a delivery into strings, unpacking
// envHeader (a string or bytes) into the envelope's fields. Any other
// header named like an envelope field (delaybridge-...) makes an
// *broker.EnvelopeError naming it: the envelope travels only in envHeader.
// Other scalar headers are formatted; tables and arrays (x-death and the
// like), the dead-letter headers and the ladder's bit headers are left out.
func fromTable(t amqp.Table) (map[string]string, error) {
	h := make(map[string]string, len(t)+8)
	var bad error
	for k, v := range t {
		if isDeathHeader(k) || strings.HasPrefix(k, "dlbl-") || k == envHeader {
			continue
		}
		if strings.HasPrefix(k, wire.HeaderPrefix) {
			if bad == nil {
				bad = &broker.EnvelopeError{Header: k, Reason: "an envelope field sent as its own AMQP header; the envelope travels only in " + envHeader}
			}
			continue
		}
		switch v := v.(type) {
		case string:
			h[k] = v
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
