package bench

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/percentile"
)

// benchRun tracks one run's tasks by index.
type benchRun struct {
	id    string
	topic string
	due   []int64 // unix ms per task
	// committed is when the transaction that scheduled each task had
	// committed (unix ms): from then on another process can see it.
	committed []atomic.Int64
	// published is when the broker first confirmed the relay's publish
	// of each task (unix ms). It is kept here, not read back from the
	// row's published_ms, which is the time of the relay's claim.
	published []atomic.Int64
	// delivered is when the consumer runtime was first handed each task's
	// message (unix µs): from due to then is the broker's share of the
	// lateness (the relay's too, for a task published late).
	delivered []atomic.Int64
	handled   []atomic.Int64 // first handled time, unix µs; 0 = not yet
	runs      []atomic.Int32 // handler runs
	count     atomic.Int64
	early     atomic.Int64
	relayed   atomic.Int64 // tasks the broker confirmed or the relay marked dead
	// group commits: transactions, the messages in them, their time
	groups, grouped, groupMicros atomic.Int64
}

func (r *benchRun) key(i int) string { return r.id + "-" + strconv.Itoa(i) }

func (r *benchRun) index(key string) (int, bool) {
	rest, ok := strings.CutPrefix(key, r.id+"-")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= len(r.due) {
		return 0, false
	}
	return i, true
}

// seen records a handler run of task i at now.
func (r *benchRun) seen(i int, now time.Time) {
	r.runs[i].Add(1)
	if r.handled[i].CompareAndSwap(0, now.UnixMicro()) {
		r.count.Add(1)
		if now.UnixMilli() < r.due[i] {
			r.early.Add(1)
		}
	}
}

// confirmClock is the relay's publisher in a bench run: it notes when
// the broker confirmed each task's first publish.
type confirmClock struct {
	broker.Publisher
	run     *benchRun
	trickle *trickle // nil without --trickle
}

func (c confirmClock) Publish(ctx context.Context, msgs ...*broker.Message) error {
	if c.trickle != nil {
		sent := time.Now().UnixMilli()
		for _, m := range msgs {
			c.trickle.note(m.Key, func(t *trickleTask) {
				if t.sent == 0 {
					t.sent = sent
				}
			})
		}
	}
	err := c.Publisher.Publish(ctx, msgs...)
	now := time.Now().UnixMilli()
	// A batch that failed in part still had the rest confirmed.
	for j, perr := range broker.PublishResults(err, len(msgs)) {
		if perr != nil {
			continue
		}
		if i, ok := c.run.index(msgs[j].Key); ok {
			if c.run.published[i].CompareAndSwap(0, now) {
				c.run.relayed.Add(1)
			}
		} else if c.trickle != nil {
			c.trickle.note(msgs[j].Key, func(t *trickleTask) {
				if t.published == 0 {
					t.published = now
				}
			})
		}
	}
	return err
}

// deliveryClock is the consumer's subscriber in a bench run: it notes when
// each task's message was first handed on to the runtime. It passes each
// delivery on as it takes it, so it holds none back.
type deliveryClock struct {
	broker.Subscriber
	run     *benchRun
	trickle *trickle      // nil without --trickle
	hold    time.Duration // the consumer's hold window
}

func (c deliveryClock) Subscribe(ctx context.Context, topic string) (<-chan *broker.Delivery, error) {
	in, err := c.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *broker.Delivery)
	go func() {
		defer close(out)
		for d := range in {
			// A message too early to hold is sent on another hop: it has
			// not reached the consumer for good yet.
			if m := d.Message; m != nil && time.Until(m.DeliverAt) <= c.hold {
				now := time.Now().UnixMicro()
				if i, ok := c.run.index(m.Key); ok {
					c.run.delivered[i].CompareAndSwap(0, now)
				} else if c.trickle != nil {
					c.trickle.note(m.Key, func(t *trickleTask) {
						if t.delivered == 0 {
							t.delivered = now
						}
					})
				}
			}
			select {
			case out <- d:
			case <-ctx.Done():
				// Nobody reads out any more (a Start that failed after
				// subscribing): give this one back, and the rest as they
				// come until the subscription closes.
				for ; d != nil; d = <-in {
					_ = d.Acker.Nack()
				}
				return
			}
		}
	}()
	return out, nil
}

// publishLateness summarizes, over the run's tasks the relay published,
// how long after its due time each reached the broker (0 when it went
// ahead), and how long after the later of due and its scheduling commit.
func (r *benchRun) publishLateness() (fromDue, fromCommit percentile.Summary) {
	var late, afterCommit []int64
	for i := range r.published {
		published := r.published[i].Load()
		if published == 0 {
			continue
		}
		late = append(late, max(published-r.due[i], 0))
		// A task confirmed a moment before the producer heard its
		// commit's answer counts as 0.
		if c := r.committed[i].Load(); c > 0 {
			afterCommit = append(afterCommit, max(published-max(c, r.due[i]), 0))
		}
	}
	return percentile.Summarize(late), percentile.Summarize(afterCommit)
}
