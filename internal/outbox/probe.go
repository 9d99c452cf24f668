package outbox

import (
	"context"
	"time"

	"github.com/delaybridge/delaybridge/internal/store"
)

// probe looks every Probe for a row the relay must claim now and wakes
// the idle loops when it finds one: a task that another process schedules
// due soon reaches the broker within about Probe, while the loops' own
// claims back off to IdleMax, or keep their Pace. With a pace, only a row
// due within 2×Pace+Probe is urgent: the paced claims take the rest well
// before they are due. It reads one index entry, without a lock or a
// transaction, and a quiet relay looks less often (probePace), so an idle
// relay stays cheap.
func (r *Relay) probe(ctx context.Context) {
	pace := probePace{fast: r.cfg.Probe, slow: r.cfg.ProbeMax}
	t := time.NewTimer(pace.next(true))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		first, err := r.first(ctx, min(r.cfg.Lookahead, r.urgent()))
		found := first != nil && err == nil
		if found {
			if at := r.resume.at.Load(); at != nil && first.Before(*at) {
				r.resume.stale.Store(true)
			}
			for range r.cfg.Workers {
				r.wake(true)
			}
		}
		t.Reset(pace.next(r.busy.Swap(false) || found))
	}
}

// ready reports whether a claim would find a row due within ahead (any
// row if the relay has no lookahead).
func (r *Relay) ready(ctx context.Context, ahead time.Duration) (bool, error) {
	first, err := r.first(ctx, ahead)
	return first != nil, err
}

// first returns the place of the first row a claim from the head of the
// index would take among those due within ahead (any row if the relay has
// no lookahead), nil if none, with one read of the index (store.First).
func (r *Relay) first(ctx context.Context, ahead time.Duration) (*store.Position, error) {
	now := r.cfg.Now()
	limit := int64(1<<63 - 1)
	if r.cfg.Lookahead > 0 {
		limit = now.Add(ahead).UnixMilli()
	}
	// The limited topics have loops of their own (topicLoop).
	return store.First(ctx, r.db, store.ClaimSpec{State: store.Pending, DueAtMost: limit, ReadyAtMost: now.UnixMilli(), PublishedAtMost: 1<<63 - 1,
		ExcludeTopics: r.limited})
}

// handling reports whether consumers have work due now: a published task
// whose due time has passed (one index read, store.First). A relay ahead
// of due rests between batches only then, as its work would take the
// cores those consumers need; before the first task of a spike comes due
// it publishes at full speed, so the spike is in the broker before it is
// due instead of being relayed while it is handled. A failed read counts
// as busy: the relay rests, as it did before it looked.
func (r *Relay) handling(ctx context.Context) bool {
	first, err := store.First(ctx, r.db, store.ClaimSpec{State: store.Published, DueAtMost: r.cfg.Now().UnixMilli(),
		ReadyAtMost: 1<<63 - 1, PublishedAtMost: 1<<63 - 1})
	return first != nil || err != nil
}

// urgent is how soon a row must be due for the probe to wake a paced
// relay: two paces and a probe, so a row the probe leaves to the next
// paced claim is published at least a pace before it is due.
func (r *Relay) urgent() time.Duration {
	if r.cfg.Pace <= 0 {
		return r.cfg.Lookahead
	}
	return 2*r.cfg.Pace + r.cfg.Probe
}

// probePace is the probe's wait between looks: Probe while the relay is
// busy, and once ProbeQuietLooks looks in a row were quiet, doubling per
// quiet look up to ProbeMax.
type probePace struct {
	fast, slow time.Duration
	quiet      int // looks in a row that found nothing, with no activity between
	wait       time.Duration
}

// next returns the wait before the next look, after a look that was busy
// (found a row, or followed a Nudge or a claim that took rows) or not.
func (p *probePace) next(busy bool) time.Duration {
	switch {
	case busy || p.wait == 0:
		p.quiet, p.wait = 0, p.fast
	case p.quiet < ProbeQuietLooks:
		p.quiet++
	default:
		p.wait = min(2*p.wait, p.slow)
	}
	return p.wait
}
