package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// maxHeadersJSON is what the headers column (TEXT) holds. JSON escapes a
// control character as six bytes, so headers within broker.MaxHeaderBytes can
// still overflow it.
const maxHeadersJSON = 65535

// EncodeHeaders returns h as the JSON the headers column holds, or nil for
// no headers. It refuses headers whose JSON would not fit the column rather
// than let a non-strict server cut them.
func EncodeHeaders(h map[string]string) (any, error) {
	if len(h) == 0 {
		return nil, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // <, > and & as themselves: fewer bytes, same meaning
	if err := enc.Encode(h); err != nil {
		return nil, fmt.Errorf("outbox: encode headers: %w", err)
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(b) > maxHeadersJSON {
		return nil, fmt.Errorf("%w: headers take %d bytes as JSON, more than the %d the headers column holds (control characters take 6 bytes each)",
			broker.ErrInvalidMessage, len(b), maxHeadersJSON)
	}
	return string(b), nil
}

// DecodeHeaders reads the headers column. Schedule writes a JSON object of
// strings, but a producer in another language may write numbers, objects,
// arrays or null as values, and rows are edited by hand now and then; one
// such row must never fail a read or a list. So it is lenient: a value that
// is not a string becomes its compact JSON text ({"tenant":1} reads as
// tenant "1"), and what no broker would carry (a name that is empty or
// holds \x01 or \x02, text that is not UTF-8, headers past
// broker.MaxHeaderBytes) is left out. The headers it returns are always
// valid for broker.Message.Validate; the error, when not nil, says what was
// left out, or that the column is not a JSON object at all (no headers are
// returned then). It never panics.
func DecodeHeaders(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, fmt.Errorf("headers column: not a JSON object: %w", err)
	}
	if raw == nil { // the column holds JSON null
		return nil, errors.New("headers column: not a JSON object: null")
	}
	names := make([]string, 0, len(raw))
	for k := range raw {
		names = append(names, k)
	}
	slices.Sort(names) // what fits MaxHeaderBytes does not depend on map order
	var (
		h       map[string]string
		dropped []string
		size    int
	)
	for _, k := range names {
		v := headerValue(raw[k])
		m := broker.Message{Topic: "t", Key: "k", DeliverAt: time.Now(), Headers: map[string]string{k: v}}
		if m.Validate() != nil || size+broker.HeaderBytes(k, v) > broker.MaxHeaderBytes {
			dropped = append(dropped, fmt.Sprintf("%.64q", k))
			continue
		}
		size += broker.HeaderBytes(k, v)
		if h == nil {
			h = make(map[string]string, len(names))
		}
		h[k] = v
	}
	if len(dropped) > 0 {
		return h, fmt.Errorf("headers column: %d header(s) left out, invalid for a broker or past %d bytes: %s",
			len(dropped), broker.MaxHeaderBytes, strings.Join(dropped, ", "))
	}
	return h, nil
}

// headerValue is a JSON value as a header's text: a string as itself,
// anything else as its compact JSON.
func headerValue(raw json.RawMessage) string {
	var s string
	if bytes.HasPrefix(bytes.TrimSpace(raw), []byte(`"`)) && json.Unmarshal(raw, &s) == nil {
		return s
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return string(raw) // cannot happen: Unmarshal checked raw
	}
	return buf.String()
}
