package rabbit

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/wire"
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
	f.Add(wire.HeaderDeliverAt, uint8(1), "", int64(1_700_000_000_000), 0.0, []byte(nil))
	f.Add(wire.HeaderKey, uint8(5), "", int64(0), 0.0, []byte("o\xff1"))
	f.Add(wire.HeaderKey, uint8(0), "other", int64(0), 0.0, []byte(nil))
	f.Add("x-death", uint8(7), "q", int64(1), 0.0, []byte(nil))
	f.Add(wire.HeaderFreePrefix+"t", uint8(0), "\x01", int64(0), 0.0, []byte(nil))
	f.Add("x-n", uint8(9), "", int64(3), 1.5, []byte{0})
	f.Add(envHeader, uint8(0), "v=1&topic=t&key=k&deliver-at=1&hop=0&attempt=0&gen=0", int64(0), 0.0, []byte(nil))
	f.Add(envHeader, uint8(0), "v=1&v=1;%zz", int64(0), 0.0, []byte(nil))
	f.Add(envHeader, uint8(5), "", int64(0), 0.0, []byte("v=1&topic=t&key=k%00&deliver-at=1"))
	f.Fuzz(func(t *testing.T, name string, kind uint8, s string, n int64, fl float64, bs []byte) {
		msg := &broker.Message{Topic: "t", Key: "k", DeliverAt: time.UnixMilli(1_700_000_000_000).UTC()}
		tab := envelopeTable(msg, 0)
		v := fieldValue(kind, s, n, fl, bs)
		tab[name] = v
		h, err := fromTable(tab)
		if err != nil {
			var ee *broker.EnvelopeError
			if !errors.As(err, &ee) || !strings.HasPrefix(name, wire.HeaderPrefix) {
				t.Fatalf("fromTable refused %q = %#v with %v", name, v, err)
			}
			return
		}
		if strings.HasPrefix(name, wire.HeaderPrefix) && name != envHeader {
			t.Fatalf("fromTable took the envelope field %q = %#v as its own header", name, v)
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

func TestEnvelope_PackedRoundTrip(t *testing.T) {
	m := &broker.Message{Topic: "order-cancel", Key: "o 42&x=%+ü", DeliverAt: time.UnixMilli(1_764_500_000_123).UTC(),
		Hop: 2, Attempt: 3, Generation: 4, TaskID: 17, Trace: "00-abc-def-01", Payload: []byte("p"),
		Headers: map[string]string{"a=b": "c&d", "tenant": "🙂", "empty": ""}}
	tab := envelopeTable(m, 0)
	s, ok := tab[envHeader].(string)
	if !ok || !strings.Contains(s, "topic=order-cancel") || !strings.Contains(s, "task=17") {
		t.Fatalf("%s = %#v, want a readable query", envHeader, tab[envHeader])
	}
	for _, v := range []any{s, []byte(s)} {
		h, err := fromTable(amqp.Table{envHeader: v, "dlbl-3": "1", "CC": []any{"order-cancel"}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := broker.Decode(h, m.Payload)
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if got.Topic != m.Topic || got.Key != m.Key || !got.DeliverAt.Equal(m.DeliverAt) || got.Hop != 2 || got.Attempt != 3 ||
			got.Generation != 4 || got.TaskID != 17 || got.Trace != m.Trace || len(got.Headers) != 3 || got.Headers["a=b"] != "c&d" ||
			got.Headers["tenant"] != "🙂" || got.Headers["empty"] != "" {
			t.Errorf("round trip gave %+v, want %+v", got, m)
		}
	}
}

// The envelope travels only in delaybridge-env: fields sent one AMQP
// header each, alone or next to a packed envelope, make an EnvelopeError
// naming the stray header, never a message.
func TestEnvelope_FieldAsItsOwnHeaderIsEnvelopeError(t *testing.T) {
	m := &broker.Message{Topic: "t", Key: "k", DeliverAt: time.UnixMilli(1_700_000_000_000).UTC(), TaskID: 9}
	split := amqp.Table{}
	for k, v := range broker.Encode(m) {
		split[k] = v
	}
	for name, tab := range map[string]amqp.Table{
		"one header per field": split,
		"next to the packed":   {envHeader: envelopeTable(m, 0)[envHeader], wire.HeaderKey: "other"},
		"free header":          {envHeader: envelopeTable(m, 0)[envHeader], wire.HeaderFreePrefix + "tenant": "eu"},
	} {
		h, err := fromTable(tab)
		var ee *broker.EnvelopeError
		if !errors.As(err, &ee) || !strings.HasPrefix(ee.Header, wire.HeaderPrefix) || ee.Header == envHeader || tab[ee.Header] == nil {
			t.Errorf("%s: fromTable = %v, %v; want an EnvelopeError naming a stray header", name, h, err)
		}
	}
}

func TestEnvelope_MalformedPackedIsEnvelopeError(t *testing.T) {
	good := envelopeTable(&broker.Message{Topic: "t", Key: "k", DeliverAt: time.UnixMilli(1).UTC()}, 0)[envHeader].(string)
	for name, tab := range map[string]amqp.Table{
		"not a string": {envHeader: int64(3)},
		"void":         {envHeader: nil},
		"empty":        {envHeader: ""},
		"no version":   {envHeader: "topic=t&key=k&deliver-at=1"},
		"bad escape":   {envHeader: "v=1&key=%zz"},
		"semicolon":    {envHeader: "v=1;key=k"},
		"field twice":  {envHeader: good + "&key=other"},
	} {
		_, err := fromTable(tab)
		var ee *broker.EnvelopeError
		if !errors.As(err, &ee) || ee.Header != envHeader || !errors.Is(err, broker.ErrMalformedEnvelope) {
			t.Errorf("%s: err = %v, want an EnvelopeError on %s", name, err, envHeader)
		}
	}
}

func TestEnvelopeTable_PublishesNoDeathHeaders(t *testing.T) {
	m := &broker.Message{Topic: "t", Key: "k", DeliverAt: time.UnixMilli(1_700_000_000_000).UTC(),
		Headers: map[string]string{"x-death": "x", "x-first-death-queue": "q", "x-last-death-reason": "expired"}}
	tab := envelopeTable(m, 0)
	if len(tab) != 1 || tab[envHeader] == nil {
		t.Fatalf("envelopeTable = %v, want only %s", tab, envHeader)
	}
	h, err := fromTable(tab)
	if err != nil {
		t.Fatal(err)
	}
	got, err := broker.Decode(h, nil)
	if err != nil || got.Headers["x-death"] != "x" || len(got.Headers) != 3 {
		t.Fatalf("Decode = %+v, %v; want the three free headers back", got, err)
	}
}

func TestFromTable_NonStringEnvelopeHeaderIsMalformed(t *testing.T) {
	_, err := fromTable(amqp.Table{wire.HeaderKey: int64(4), "x-death": []any{amqp.Table{"count": int64(1)}}})
	var ee *broker.EnvelopeError
	if !errors.As(err, &ee) || ee.Header != wire.HeaderKey {
		t.Fatalf("err = %v, want an EnvelopeError on %s", err, wire.HeaderKey)
	}
	h, err := fromTable(amqp.Table{"n": int32(3), "x-death": []any{}, "x-first-death-queue": "q", "dlbl-0": "1"})
	if err != nil || h["n"] != "3" || len(h) != 1 {
		t.Errorf("fromTable = %v, %v", h, err)
	}
}
