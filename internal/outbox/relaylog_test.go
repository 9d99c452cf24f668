package outbox_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
)

func TestLogProgress_OneSummaryLinePerIntervalAndNextHooksStillCalled(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var published, failed, dead, claimed int
	next := outbox.RelayHooks{
		Published: func(n int, _ time.Duration) { published += n },
		Failed:    func(n int) { failed += n },
		Dead:      func(n int) { dead += n },
		Claimed:   func(n int) { claimed += n },
	}
	h := outbox.LogProgress(next, logger, 50*time.Millisecond)
	for range 100 {
		h.Published(10, time.Millisecond)
	}
	h.Failed(3)
	h.Dead(1)
	h.Claimed(4)
	if buf.Len() != 0 {
		t.Fatalf("logged before the interval passed:\n%s", buf.String())
	}
	time.Sleep(60 * time.Millisecond)
	h.Published(5, 7*time.Millisecond)
	h.Published(5, time.Millisecond)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines, want one summary:\n%s", len(lines), buf.String())
	}
	for _, want := range []string{"level=INFO", "relay: progress", "published=1005", "failed=3", "dead=1", "slowest_publish=7ms"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("summary %q lacks %q", lines[0], want)
		}
	}
	if published != 1010 || failed != 3 || dead != 1 || claimed != 4 {
		t.Errorf("next hooks saw published %d failed %d dead %d claimed %d", published, failed, dead, claimed)
	}
}
