package broker_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// A dead message of a decoded message keeps at most 64 KiB of its
// payload and says how large it was.
func TestDeadMessage_CutsALargePayload(t *testing.T) {
	t.Parallel()
	m := sampleMessage()
	m.Payload = []byte(strings.Repeat("p", 1<<20))
	dead := broker.DeadMessage(&broker.Delivery{Message: m}, errors.New("failed"), "dead")
	if len(dead.Payload) != 64<<10 || dead.Headers[broker.DeadHeaderTruncated] != "1048576" {
		t.Fatalf("dead payload %d bytes, %s=%q; want 64 KiB and 1048576", len(dead.Payload), broker.DeadHeaderTruncated, dead.Headers[broker.DeadHeaderTruncated])
	}
	small := broker.DeadMessage(&broker.Delivery{Message: sampleMessage()}, errors.New("failed"), "dead")
	if _, ok := small.Headers[broker.DeadHeaderTruncated]; ok {
		t.Fatal("a small payload marked truncated")
	}
}
