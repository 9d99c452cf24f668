package rocket

import (
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// brokerSettle is how long the publisher keeps sending a topic's messages
// to the other broker groups after a group appears in the topic's route
// (a master that returns after a crash, or a new one). The consumers learn
// the route on their own, at their route refresh (every 30 s in
// rocketmq-client-go) and take the group's queues at their next rebalance
// (every 20 s): a message sent to the group before then waits for them.
// Without the settling time, tasks sent there right after its return are
// late by up to that refresh and rebalance (docs/deployment.md, "RocketMQ
// with several broker groups").
const brokerSettle = 60 * time.Second

// queueSelector picks the queue of each send: round-robin over the
// topic's queues, first over those of settled groups other than the one the
// last attempt went to (on a retry; as the client's own round-robin selector
// skips it), else over any other group's, else over all. A group is settled
// once it has been in the route for settle; the groups in a topic's route at
// its first send count as settled.
type queueSelector struct {
	settle time.Duration
	now    func() time.Time

	mu     sync.Mutex
	topics map[string]*topicRoute
}

type topicRoute struct {
	next   uint32
	joined map[string]time.Time // broker name -> when it joined the route; zero: at the first send
}

func newQueueSelector(settle time.Duration) *queueSelector {
	return &queueSelector{settle: settle, now: time.Now, topics: map[string]*topicRoute{}}
}

// Select implements producer.QueueSelector.
func (s *queueSelector) Select(msg *primitive.Message, mqs []*primitive.MessageQueue, lastBrokerName string) *primitive.MessageQueue {
	if len(mqs) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r, ok := s.topics[msg.Topic]
	if !ok {
		if len(s.topics) >= broker.MaxTrackedTopics {
			// Forget them all: each then starts again with its current
			// groups settled, as at its first send.
			s.topics = map[string]*topicRoute{}
		}
		r = &topicRoute{joined: map[string]time.Time{}}
		for _, q := range mqs {
			r.joined[q.BrokerName] = time.Time{}
		}
		s.topics[msg.Topic] = r
	}
	present := make(map[string]bool, 2)
	for _, q := range mqs {
		present[q.BrokerName] = true
		if _, known := r.joined[q.BrokerName]; !known {
			r.joined[q.BrokerName] = now
		}
	}
	for name := range r.joined {
		if !present[name] {
			// Left the route: when it comes back, it joins anew.
			delete(r.joined, name)
		}
	}

	settled := func(q *primitive.MessageQueue) bool {
		at := r.joined[q.BrokerName]
		return at.IsZero() || now.Sub(at) >= s.settle
	}
	notLast := func(q *primitive.MessageQueue) bool { return q.BrokerName != lastBrokerName }
	for _, keep := range []func(*primitive.MessageQueue) bool{
		func(q *primitive.MessageQueue) bool { return settled(q) && notLast(q) },
		notLast,
	} {
		var n uint32
		for _, q := range mqs {
			if keep(q) {
				n++
			}
		}
		if n == 0 {
			continue
		}
		r.next++
		i := r.next % n
		for _, q := range mqs {
			if keep(q) {
				if i == 0 {
					return q
				}
				i--
			}
		}
	}
	r.next++
	return mqs[r.next%uint32(len(mqs))]
}
