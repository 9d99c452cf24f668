package console

import (
	"strings"
	"testing"
	"time"
)

func TestCSRF_TokenIsBoundToUserAndTimeAndKey(t *testing.T) {
	now := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	c, err := newCSRF(clock)
	if err != nil {
		t.Fatal(err)
	}
	tok := c.token("ops")
	if err := c.check("ops", tok); err != nil {
		t.Fatalf("fresh token refused: %v", err)
	}
	other, err := newCSRF(clock)
	if err != nil {
		t.Fatal(err)
	}
	ts, mac, _ := strings.Cut(tok, ".")
	flipped := []byte(mac)
	flipped[0] ^= 1
	for name, bad := range map[string]string{
		"empty":           "",
		"no dot":          ts + mac,
		"bad time":        "x." + mac,
		"tampered mac":    ts + "." + string(flipped),
		"moved time":      "1" + ts + "." + mac,
		"another process": other.token("ops"),
	} {
		if err := c.check("ops", bad); err == nil {
			t.Errorf("%s: token %q accepted", name, bad)
		}
	}
	if err := c.check("eve", tok); err == nil {
		t.Error("a token issued to ops was accepted for eve")
	}
	now = now.Add(csrfTTL - time.Second)
	if err := c.check("ops", tok); err != nil {
		t.Errorf("token refused just before it expires: %v", err)
	}
	now = now.Add(2 * time.Second)
	if err := c.check("ops", tok); err == nil {
		t.Error("expired token accepted")
	}
}
