package store

import (
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
)

func TestDecodeHeaders_DropsWhatNoBrokerCarries(t *testing.T) {
	t.Parallel()
	for _, col := range []string{`{"h": 1}`, `[]`, `{"h": "a\u0001b"}`, `{"": "v"}`, `{"h"`} {
		if h, err := DecodeHeaders(col); err == nil {
			t.Errorf("DecodeHeaders(%q) = %v, want an error", col, h)
		}
	}
	h, err := DecodeHeaders(`{"q'uote": "\"\\ % _ \u0000 <&>"}`)
	if err != nil || h["q'uote"] != "\"\\ % _ \x00 <&>" {
		t.Fatalf("DecodeHeaders = %q, %v", h, err)
	}
	if h, err := DecodeHeaders(`{}`); h != nil || err != nil {
		t.Fatalf("empty object: %v, %v; want no headers", h, err)
	}
}

// FuzzDecodeHeaders reads the headers column as a hand-edited row might
// hold it: whatever decodes must be valid and survive EncodeHeaders.
func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range []string{`{"tenant":"acme"}`, `{"a":"<&>\u0000"}`, `{"a":1}`, `{"\u0001":""}`, `null`, `{"a":"b","a":"c"}`, ``} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, col string) {
		h, err := DecodeHeaders(col)
		if err != nil {
			return
		}
		m := broker.Message{Topic: "t", Key: "k", DeliverAt: time.Now(), Headers: h}
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded headers %q are invalid: %v", h, err)
		}
		enc, err := EncodeHeaders(h)
		if errors.Is(err, broker.ErrInvalidMessage) {
			return // valid, but its JSON would not fit the column
		}
		if err != nil {
			t.Fatalf("EncodeHeaders(%q): %v", h, err)
		}
		s, _ := enc.(string)
		again, err := DecodeHeaders(s)
		if err != nil || !maps.Equal(again, h) {
			t.Fatalf("round trip of %q gave %q, %v", h, again, err)
		}
	})
}
