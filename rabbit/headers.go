package rabbit

import (
	"fmt"
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

// toTable turns string headers into an AMQP table with room for extra more
// entries, dropping dead-letter bookkeeping.
func toTable(h map[string]string, extra int) amqp.Table {
	t := make(amqp.Table, len(h)+extra)
	for k, v := range h {
		if isDeathHeader(k) {
			continue
		}
		t[k] = v
	}
	return t
}

// fromTable turns the headers of a delivery into strings. Envelope headers
// must be strings; one that is not makes an *broker.EnvelopeError. Other
// scalar headers are formatted; tables and arrays (x-death and the like),
// the dead-letter headers and the ladder's bit headers are left out.
func fromTable(t amqp.Table) (map[string]string, error) {
	h := make(map[string]string, len(t))
	var bad error
	for k, v := range t {
		if isDeathHeader(k) || strings.HasPrefix(k, "dlbl-") {
			continue
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
	return h, bad
}
