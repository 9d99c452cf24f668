package console

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// A payload cut at the reveal limit stays text when it was text: the cut
// drops a character it split rather than turn the whole payload into hex.
func TestCutText_KeepsValidTextValid(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    []byte
		n    int
		want int
	}{
		{"ascii", []byte("abcdef"), 4, 4},
		{"shorter than the limit", []byte("ab"), 4, 2},
		{"two-byte rune split", []byte("aaaé"), 4, 3},
		{"two-byte rune whole", []byte("aaé"), 4, 4},
		{"four-byte rune split after one byte", []byte("a😀"), 2, 1},
		{"four-byte rune split after three bytes", []byte("a😀"), 4, 1},
		{"four-byte rune whole", []byte("a😀b"), 5, 5},
		{"binary stays as cut", []byte{0xff, 0xfe, 0xfd, 0xfc, 0xfb}, 3, 3},
	} {
		got := cutText(tc.p, tc.n)
		if len(got) != tc.want || !bytes.HasPrefix(tc.p, got) {
			t.Errorf("%s: cutText(%q, %d) = %q, want its first %d bytes", tc.name, tc.p, tc.n, got, tc.want)
		}
		if utf8.Valid(tc.p) && !utf8.Valid(got) {
			t.Errorf("%s: cutting valid text gave invalid %q", tc.name, got)
		}
	}
	big := append(bytes.Repeat([]byte("a"), revealLimit-1), []byte("éb")...)
	if got := cutText(big, revealLimit); len(got) != revealLimit-1 || !utf8.Valid(got) {
		t.Fatalf("a text payload cut through its last character at the limit: %d bytes, valid %v", len(got), utf8.Valid(got))
	}
}

// The timeline lists timed events in time order whatever order they were
// found in, and an untimed note stays after the timed event it belongs to.
func TestTimeline_InTimeOrder(t *testing.T) {
	now := time.Date(2026, 12, 3, 5, 0, 0, 0, time.UTC)
	d := &ops.Detail{}
	d.State = outbox.StatePending
	d.CreatedAt = now.Add(-time.Minute)
	d.Task.DueAt = now.Add(10 * time.Minute)
	d.NextAttemptAt = now.Add(time.Hour) // backed off past due
	d.PublishAttempts = 3
	d.LastError = "broker down"
	var whats []string
	var last time.Time
	for _, e := range timeline(d, now) {
		whats = append(whats, e.What)
		if e.At.IsZero() {
			continue
		}
		if e.At.Before(last) {
			t.Errorf("%q at %s listed after an event at %s", e.What, e.At, last)
		}
		last = e.At
	}
	got := strings.Join(whats, " | ")
	due := strings.Index(got, "due (in the future)")
	next := strings.Index(got, "next publish attempt")
	if due < 0 || next < 0 || next < due {
		t.Errorf("timeline %q: want the due time before the later publish attempt", got)
	}
	if !strings.HasPrefix(got, "scheduled") {
		t.Errorf("timeline %q does not start with the scheduling", got)
	}
	// The untimed count of attempts follows the event before it in the
	// order it was found (the backed-off attempt), not the start.
	if attempts := strings.Index(got, "3 publish attempt(s)"); attempts < next {
		t.Errorf("timeline %q: the attempt count left the attempt it follows", got)
	}
}
