package broker_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/wire"
)

func sampleMessage() *broker.Message {
	return &broker.Message{
		TaskID: 42, Topic: "order-cancel", Key: "order-42",
		Payload:   []byte(`{"order":42}`),
		DeliverAt: time.Date(2026, 11, 30, 12, 30, 0, 123_000_000, time.UTC),
		Hop:       2, Attempt: 1, Generation: 3,
		Trace:   "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		Headers: map[string]string{"tenant": "acme", "delaybridge-v": "looks like ours but is free"},
	}
}

func TestEnvelope_RoundTripKeepsEveryField(t *testing.T) {
	t.Parallel()
	m := sampleMessage()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	got, err := broker.Decode(broker.Encode(m), m.Payload)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if got.TaskID != m.TaskID || got.Topic != m.Topic || got.Key != m.Key || string(got.Payload) != string(m.Payload) ||
		!got.DeliverAt.Equal(m.DeliverAt) || got.DeliverAt.Location() != time.UTC || got.Hop != m.Hop ||
		got.Attempt != m.Attempt || got.Generation != m.Generation || got.Trace != m.Trace || !maps.Equal(got.Headers, m.Headers) {
		t.Fatalf("round trip changed the message:\n got %+v\nwant %+v", got, m)
	}
}

func TestEnvelope_DecodeIgnoresForeignHeaders(t *testing.T) {
	t.Parallel()
	h := broker.Encode(sampleMessage())
	h["x-death"] = "whatever"
	h["TIMER_OUT_MS"] = "1"
	got, err := broker.Decode(h, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Headers["x-death"]; ok {
		t.Fatal("a broker header leaked into the free headers")
	}
}

func TestEnvelope_DecodeRejectsMalformed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		edit   func(h map[string]string)
		header string
	}{
		{"wrong version", func(h map[string]string) { h[wire.HeaderVersion] = "2" }, wire.HeaderVersion},
		{"missing topic", func(h map[string]string) { delete(h, wire.HeaderTopic) }, wire.HeaderTopic},
		{"bad topic", func(h map[string]string) { h[wire.HeaderTopic] = "orders.cancel" }, wire.HeaderTopic},
		{"missing key", func(h map[string]string) { delete(h, wire.HeaderKey) }, wire.HeaderKey},
		{"empty key", func(h map[string]string) { h[wire.HeaderKey] = "" }, wire.HeaderKey},
		{"key not UTF-8", func(h map[string]string) { h[wire.HeaderKey] = "\xff\xfe" }, wire.HeaderKey},
		{"due not a number", func(h map[string]string) { h[wire.HeaderDeliverAt] = "tomorrow" }, wire.HeaderDeliverAt},
		{"due in year 10000", func(h map[string]string) { h[wire.HeaderDeliverAt] = "253402300800000" }, wire.HeaderDeliverAt},
		{"due before 2000", func(h map[string]string) { h[wire.HeaderDeliverAt] = "-5" }, wire.HeaderDeliverAt},
		{"negative hop", func(h map[string]string) { h[wire.HeaderHop] = "-1" }, wire.HeaderHop},
		{"attempt overflow", func(h map[string]string) { h[wire.HeaderAttempt] = "99999999999999999999" }, wire.HeaderAttempt},
		{"missing generation", func(h map[string]string) { delete(h, wire.HeaderGeneration) }, wire.HeaderGeneration},
		{"zero task id", func(h map[string]string) { h[wire.HeaderTaskID] = "0" }, wire.HeaderTaskID},
		{"huge trace", func(h map[string]string) { h[wire.HeaderTrace] = strings.Repeat("t", 600) }, wire.HeaderTrace},
		{"key with a property separator", func(h map[string]string) { h[wire.HeaderKey] = "a\x01b" }, wire.HeaderKey},
		{"trace with a property separator", func(h map[string]string) { h[wire.HeaderTrace] = "a\x02b" }, wire.HeaderTrace},
		{"free header with a property separator", func(h map[string]string) { h[wire.HeaderFreePrefix+"x"] = "a\x01b" }, `"delaybridge-h-x"`},
		{"many small free headers", func(h map[string]string) {
			// 1,000 headers of 4 bytes: small by name and value, but 23 KB on the wire.
			for i := range 1000 {
				h[fmt.Sprintf("%s%03d", wire.HeaderFreePrefix, i)] = "v"
			}
		}, wire.HeaderFreePrefix + "*"},
		{"huge free headers", func(h map[string]string) {
			for i := range 20 {
				h[wire.HeaderFreePrefix+strings.Repeat("k", i+1)] = strings.Repeat("v", 1000)
			}
		}, wire.HeaderFreePrefix + "*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := broker.Encode(sampleMessage())
			tc.edit(h)
			_, err := broker.Decode(h, nil)
			var ee *broker.EnvelopeError
			if !errors.As(err, &ee) || !errors.Is(err, broker.ErrMalformedEnvelope) {
				t.Fatalf("Decode = %v, want an *EnvelopeError", err)
			}
			if ee.Header != tc.header {
				t.Fatalf("EnvelopeError names header %q, want %q", ee.Header, tc.header)
			}
		})
	}
}

func TestEnvelope_DecodeWithoutEnvelopeIsErrNoEnvelope(t *testing.T) {
	t.Parallel()
	for _, h := range []map[string]string{nil, {}, {"content-type": "application/json"}} {
		if _, err := broker.Decode(h, []byte("x")); !errors.Is(err, broker.ErrNoEnvelope) {
			t.Fatalf("Decode(%v) = %v, want ErrNoEnvelope", h, err)
		}
	}
}

func TestMessageValidate_RejectsWhatNoBrokerCarries(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		edit func(m *broker.Message)
		want error
	}{
		"empty topic":          {func(m *broker.Message) { m.Topic = "" }, broker.ErrInvalidTopic},
		"topic with a dot":     {func(m *broker.Message) { m.Topic = "a.b" }, broker.ErrInvalidTopic},
		"topic with a space":   {func(m *broker.Message) { m.Topic = "a b" }, broker.ErrInvalidTopic},
		"topic of 128 chars":   {func(m *broker.Message) { m.Topic = strings.Repeat("a", 128) }, broker.ErrInvalidTopic},
		"empty key":            {func(m *broker.Message) { m.Key = "" }, broker.ErrInvalidKey},
		"key of 256 bytes":     {func(m *broker.Message) { m.Key = strings.Repeat("k", 256) }, broker.ErrInvalidKey},
		"zero due time":        {func(m *broker.Message) { m.DeliverAt = time.Time{} }, broker.ErrInvalidMessage},
		"negative attempt":     {func(m *broker.Message) { m.Attempt = -1 }, broker.ErrInvalidMessage},
		"header not UTF-8":     {func(m *broker.Message) { m.Headers["bad"] = "\xff" }, broker.ErrInvalidMessage},
		"empty header name":    {func(m *broker.Message) { m.Headers[""] = "v" }, broker.ErrInvalidMessage},
		"headers over limit":   {func(m *broker.Message) { m.Headers["big"] = strings.Repeat("v", broker.MaxHeaderBytes) }, broker.ErrInvalidMessage},
		"trace over the limit": {func(m *broker.Message) { m.Trace = strings.Repeat("t", broker.MaxTraceLen+1) }, broker.ErrInvalidMessage},
		"key with \\x01":       {func(m *broker.Message) { m.Key = "a\x01" }, broker.ErrInvalidKey},
		"header with \\x02":    {func(m *broker.Message) { m.Headers["h"] = "\x02" }, broker.ErrInvalidMessage},
		"trace with \\x01":     {func(m *broker.Message) { m.Trace = "\x01" }, broker.ErrInvalidMessage},
		"many small headers":   {func(m *broker.Message) { manyHeaders(m, 1000) }, broker.ErrInvalidMessage},
	} {
		m := sampleMessage()
		tc.edit(m)
		if err := m.Validate(); !errors.Is(err, tc.want) {
			t.Errorf("%s: Validate() = %v, want %v", name, err, tc.want)
		}
	}
	m := sampleMessage()
	m.Topic = strings.Repeat("a", 127)
	m.Key = "'\"\\%_\x00;" + strings.Repeat("k", 255-7)
	if err := m.Validate(); err != nil {
		t.Errorf("longest topic and a key with quotes and NUL: %v", err)
	}
	m.Headers = map[string]string{"h": strings.Repeat("v", broker.MaxHeaderBytes-broker.HeaderBytes("h", ""))}
	if err := m.Validate(); err != nil {
		t.Errorf("headers at exactly MaxHeaderBytes: %v", err)
	}
	m.Headers["h"] += "v"
	if err := m.Validate(); !errors.Is(err, broker.ErrInvalidMessage) {
		t.Errorf("headers one byte over MaxHeaderBytes: %v", err)
	}
}

// manyHeaders gives m n one-byte headers.
func manyHeaders(m *broker.Message, n int) {
	m.Headers = map[string]string{}
	for i := range n {
		m.Headers[fmt.Sprintf("%03d", i)] = "v"
	}
}

func FuzzDecode(f *testing.F) {
	good := broker.Encode(sampleMessage())
	f.Add(good[wire.HeaderVersion], good[wire.HeaderTopic], good[wire.HeaderKey], good[wire.HeaderDeliverAt], good[wire.HeaderHop], good[wire.HeaderGeneration], "tenant", "acme")
	f.Add("1", "t", "k", "253402300799000", "0", "0", "", "")
	f.Add("1", "a.b", "\xff", "x", "-1", "9223372036854775808", "\x00", "\xfe")
	f.Fuzz(func(t *testing.T, version, topic, key, due, hop, gen, hname, hval string) {
		h := map[string]string{
			wire.HeaderVersion: version, wire.HeaderTopic: topic, wire.HeaderKey: key,
			wire.HeaderDeliverAt: due, wire.HeaderHop: hop, wire.HeaderAttempt: hop,
			wire.HeaderGeneration: gen, wire.HeaderFreePrefix + hname: hval,
		}
		m, err := broker.Decode(h, []byte(hval))
		if err != nil {
			if !errors.Is(err, broker.ErrMalformedEnvelope) && !errors.Is(err, broker.ErrNoEnvelope) {
				t.Fatalf("Decode returned an untyped error: %v", err)
			}
			return
		}
		// Whatever decodes must be a valid message that encodes back to
		// the same envelope.
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded message is invalid: %v (%+v)", err, m)
		}
		again, err := broker.Decode(broker.Encode(m), m.Payload)
		if err != nil {
			t.Fatalf("re-decoding what Decode produced failed: %v", err)
		}
		if again.Topic != m.Topic || again.Key != m.Key || !again.DeliverAt.Equal(m.DeliverAt) || again.Hop != m.Hop ||
			again.Generation != m.Generation || !maps.Equal(again.Headers, m.Headers) {
			t.Fatalf("round trip changed %+v into %+v", m, again)
		}
	})
}

func TestPublishError_UnwrapFindsAnyFailure(t *testing.T) {
	t.Parallel()
	nacked := errors.New("nacked")
	err := error(&broker.PublishError{Failed: map[int]error{3: nacked, 1: broker.ErrRejected}})
	if !errors.Is(err, nacked) || !errors.Is(err, broker.ErrRejected) {
		t.Fatalf("errors.Is cannot see the failures of %v", err)
	}
	res := broker.PublishResults(err, 4)
	if res[0] != nil || res[2] != nil || res[1] != broker.ErrRejected || res[3] != nacked {
		t.Fatalf("PublishResults = %v", res)
	}
	if all := broker.PublishResults(context.Canceled, 2); all[0] != context.Canceled || all[1] != context.Canceled {
		t.Fatalf("a plain error must fail every message: %v", all)
	}
}

// A body larger than any delaybridge message is malformed before any
// field is read, and its dead letter carries at most MaxBody of it.
func TestDecode_BodyOverMaxBodyIsMalformed(t *testing.T) {
	t.Parallel()
	m := &broker.Message{Topic: "t", Key: "k", DeliverAt: broker.MillisUTC(time.Now())}
	big := make([]byte, broker.MaxBody+1)
	_, err := broker.Decode(broker.Encode(m), big)
	var ee *broker.EnvelopeError
	if !errors.As(err, &ee) || ee.Header != "body" {
		t.Fatalf("Decode of %d bytes = %v, want an EnvelopeError for the body", len(big), err)
	}
	if _, err := broker.Decode(broker.Encode(m), big[:broker.MaxBody]); err != nil {
		t.Fatalf("Decode of MaxBody bytes = %v", err)
	}
	dead := broker.DeadMessage(&broker.Delivery{Err: err, Headers: broker.Encode(m), Body: big}, err, "dead")
	if len(dead.Payload) > broker.MaxBody {
		t.Fatalf("dead letter carries %d bytes", len(dead.Payload))
	}
}
