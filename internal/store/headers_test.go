package store

import (
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// A column another producer wrote, numbers and all, reads as text; what
// no broker carries is left out with an error that says so; nothing fails.
func TestDecodeHeaders_ReadsAnyJSONObjectLeniently(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		col     string
		want    map[string]string
		wantErr bool
	}{
		{`{"tenant":1}`, map[string]string{"tenant": "1"}, false},
		{`{"a":1.50,"b":true,"c":null,"d":{"x": [1, "y"]},"e":[]}`, map[string]string{"a": "1.50", "b": "true", "c": "null", "d": `{"x":[1,"y"]}`, "e": "[]"}, false},
		{`{"ok":"v","h":"a\u0001b"}`, map[string]string{"ok": "v"}, true},
		{`{"":"v"}`, nil, true},
		{`{"big":"` + strings.Repeat("x", broker.MaxHeaderBytes) + `","small":"s"}`, map[string]string{"small": "s"}, true},
		{`[]`, nil, true},
		{`null`, nil, true},
		{`"text"`, nil, true},
		{`{"h"`, nil, true},
		{`{}`, nil, false},
	} {
		h, err := DecodeHeaders(c.col)
		if !maps.Equal(h, c.want) || (err != nil) != c.wantErr {
			t.Errorf("DecodeHeaders(%.40q) = %q, %v; want %q, error %v", c.col, h, err, c.want, c.wantErr)
		}
	}
	h, err := DecodeHeaders(`{"q'uote": "\"\\ % _ \u0000 <&>"}`)
	if err != nil || h["q'uote"] != "\"\\ % _ \x00 <&>" {
		t.Fatalf("DecodeHeaders = %q, %v", h, err)
	}
}

// FuzzDecodeHeaders reads the headers column as a hand-edited row might
// hold it: whatever decodes, error or not, must be valid, and survive
// EncodeHeaders and a second decode unchanged and without an error.
func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range []string{`{"tenant":"acme"}`, `{"a":"<&>\u0000"}`, `{"a":1}`, `{"\u0001":""}`, `null`, `{"a":"b","a":"c"}`, ``, `{"a":{"b":[1,null]}}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, col string) {
		h, _ := DecodeHeaders(col)
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
