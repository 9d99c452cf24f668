package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/delaybridge/delaybridge/broker"
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

// DecodeHeaders reads the headers column as Schedule wrote it. Rows are
// edited by hand now and then, so it checks what it returns as
// Message.Validate would, and never panics.
func DecodeHeaders(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, fmt.Errorf("headers column: %w", err)
	}
	m := broker.Message{Topic: "t", Key: "k", DeliverAt: time.Now(), Headers: h}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("headers column: %w", err)
	}
	if len(h) == 0 {
		h = nil
	}
	return h, nil
}
