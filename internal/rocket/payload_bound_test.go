package rocket

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// A payload larger than any subscriber accepts is refused for good before
// it is sent, however well it compresses: the client compresses a body, so
// the broker's own 4 MiB limit may let it in, and every consumer would then
// refuse it as malformed while the scanner published it again for ever.
func TestValidate_RefusesAPayloadNoSubscriberAccepts(t *testing.T) {
	m := &broker.Message{Topic: "t", Key: "k", DeliverAt: time.Now(), Payload: bytes.Repeat([]byte{'z'}, broker.MaxBody+1)}
	if err := validate(m); !errors.Is(err, broker.ErrRejected) {
		t.Fatalf("a payload of broker.MaxBody + 1 bytes: validate = %v, want ErrRejected", err)
	}
	m.Payload = m.Payload[:broker.MaxBody]
	if err := validate(m); err != nil {
		t.Fatalf("a payload of exactly broker.MaxBody: validate = %v, want it sent", err)
	}
}
