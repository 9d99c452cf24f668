package outbox

import (
	"log/slog"
	"sync"
	"time"
)

// DefaultLogEvery is how often LogProgress's summary line may come.
const DefaultLogEvery = 30 * time.Second

// LogProgress returns hooks that call next's and log, at info, one summary
// line of the relay's work at most every interval (DefaultLogEvery when
// zero): how many messages it published, how many failed and will be tried
// again, how many went dead, and the slowest publish since the last line.
// The line comes with the first claim after the interval, so an idle relay
// stays quiet and a working one is seen working without a line per
// message.
func LogProgress(next RelayHooks, logger *slog.Logger, interval time.Duration) RelayHooks {
	if logger == nil {
		logger = slog.Default()
	}
	if interval <= 0 {
		interval = DefaultLogEvery
	}
	p := &progress{log: logger, every: interval, since: time.Now()}
	return RelayHooks{
		Published: func(n int, took time.Duration) {
			if next.Published != nil {
				next.Published(n, took)
			}
			p.add(n, 0, 0, took)
		},
		Failed: func(n int) {
			if next.Failed != nil {
				next.Failed(n)
			}
			p.add(0, n, 0, 0)
		},
		Dead: func(n int) {
			if next.Dead != nil {
				next.Dead(n)
			}
			p.add(0, 0, n, 0)
		},
		Claimed: next.Claimed,
	}
}

// progress counts the relay's work between two summary lines.
type progress struct {
	log   *slog.Logger
	every time.Duration

	mu                sync.Mutex
	since             time.Time
	published, failed int
	dead              int
	slowest           time.Duration
}

func (p *progress) add(published, failed, dead int, took time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.published += published
	p.failed += failed
	p.dead += dead
	p.slowest = max(p.slowest, took)
	now := time.Now()
	if now.Sub(p.since) < p.every {
		return
	}
	p.log.Info("relay: progress", "published", p.published, "failed", p.failed, "dead", p.dead,
		"slowest_publish", p.slowest, "over", now.Sub(p.since).Round(time.Second))
	p.since, p.published, p.failed, p.dead, p.slowest = now, 0, 0, 0, 0
}
