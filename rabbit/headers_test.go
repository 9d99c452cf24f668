package rabbit

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
)

// fieldValue makes an AMQP field value of one of the types a foreign
// producer can put in a header table.
func fieldValue(kind uint8, s string, n int64, f float64, bs []byte) any {
	switch kind % 11 {
	case 0:
		return s
	case 1:
		return n
	case 2:
		return int32(n)
	case 3:
		return n%2 == 0
	case 4:
		return f
	case 5:
		return bs
	case 6:
		return amqp.Table{s: n}
	case 7:
		return []any{s, n}
	case 8:
		return time.Unix(n%(1<<35), 0)
	case 9:
		return amqp.Decimal{Scale: uint8(n), Value: int32(n)}
	default:
		return nil
	}
}

// FuzzFromTable feeds the header tables a foreign producer could send,
// next to a good envelope, through fromTable and Decode: they never panic,
// refuse only with typed errors, and what decodes is a valid message.
func FuzzFromTable(f *testing.F) {
	f.Add(broker.HeaderDeliverAt, uint8(1), "", int64(1_700_000_000_000), 0.0, []byte(nil))
	f.Add(broker.HeaderKey, uint8(5), "", int64(0), 0.0, []byte("o\xff1"))
	f.Add("x-death", uint8(7), "q", int64(1), 0.0, []byte(nil))
	f.Add(broker.HeaderFreePrefix+"t", uint8(0), "\x01", int64(0), 0.0, []byte(nil))
	f.Add("x-n", uint8(9), "", int64(3), 1.5, []byte{0})
	f.Fuzz(func(t *testing.T, name string, kind uint8, s string, n int64, fl float64, bs []byte) {
		msg := &broker.Message{Topic: "t", Key: "k", DeliverAt: time.UnixMilli(1_700_000_000_000).UTC()}
		tab := toTable(broker.Encode(msg), 0)
		v := fieldValue(kind, s, n, fl, bs)
		tab[name] = v
		h, err := fromTable(tab)
		if err != nil {
			var ee *broker.EnvelopeError
			if !errors.As(err, &ee) || !strings.HasPrefix(name, broker.HeaderPrefix) {
				t.Fatalf("fromTable refused %q = %#v with %v", name, v, err)
			}
			return
		}
		for k := range h {
			if isDeathHeader(k) || strings.HasPrefix(k, "dlbl-") {
				t.Fatalf("bookkeeping header %q kept", k)
			}
		}
		m, err := broker.Decode(h, nil)
		if err != nil {
			if !errors.Is(err, broker.ErrMalformedEnvelope) && !errors.Is(err, broker.ErrNoEnvelope) {
				t.Fatalf("Decode: untyped error %v", err)
			}
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded an invalid message: %v", err)
		}
	})
}
