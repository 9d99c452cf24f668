package rocket

import (
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

func queues(brokers ...string) []*primitive.MessageQueue {
	var mqs []*primitive.MessageQueue
	for _, b := range brokers {
		for i := range 4 {
			mqs = append(mqs, &primitive.MessageQueue{Topic: "t", BrokerName: b, QueueId: i})
		}
	}
	return mqs
}

// pick runs n selections and counts the picks per broker and per queue.
func pick(s *queueSelector, mqs []*primitive.MessageQueue, last string, n int) (perBroker map[string]int, perQueue map[primitive.MessageQueue]int) {
	perBroker, perQueue = map[string]int{}, map[primitive.MessageQueue]int{}
	msg := primitive.NewMessage("t", nil)
	for range n {
		q := s.Select(msg, mqs, last)
		perBroker[q.BrokerName]++
		perQueue[*q]++
	}
	return perBroker, perQueue
}

func TestQueueSelector_RoundRobinOverTheGroupsOfTheFirstRoute(t *testing.T) {
	s := newQueueSelector(time.Minute)
	mqs := queues("broker-a", "broker-b")
	perBroker, perQueue := pick(s, mqs, "", 80)
	if len(perQueue) != 8 {
		t.Fatalf("picked %d distinct queues of 8: %v", len(perQueue), perQueue)
	}
	for q, n := range perQueue {
		if n != 10 {
			t.Errorf("queue %v picked %d times of 80, want 10", q, n)
		}
	}
	if perBroker["broker-a"] != 40 || perBroker["broker-b"] != 40 {
		t.Errorf("per broker %v, want 40 each", perBroker)
	}
}

func TestQueueSelector_AGroupThatReturnsWaitsTheSettlingTime(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := newQueueSelector(time.Minute)
	s.now = func() time.Time { return now }
	both, onlyB := queues("broker-a", "broker-b"), queues("broker-b")
	pick(s, both, "", 8)

	// broker-a dies and leaves the route...
	now = now.Add(30 * time.Second)
	if got, _ := pick(s, onlyB, "", 8); got["broker-b"] != 8 {
		t.Fatalf("with broker-a out of the route: %v", got)
	}
	// ...and comes back: its queues wait a minute.
	now = now.Add(30 * time.Second)
	if got, _ := pick(s, both, "", 40); got["broker-a"] != 0 {
		t.Errorf("broker-a back for 0 s got %d of 40 sends", got["broker-a"])
	}
	now = now.Add(59 * time.Second)
	if got, _ := pick(s, both, "", 40); got["broker-a"] != 0 {
		t.Errorf("broker-a back for 59 s got %d of 40 sends", got["broker-a"])
	}
	now = now.Add(time.Second)
	if got, _ := pick(s, both, "", 40); got["broker-a"] != 20 || got["broker-b"] != 20 {
		t.Errorf("broker-a back for 60 s: %v, want 20 each", got)
	}
}

func TestQueueSelector_ANewGroupWaitsButIsUsedWhenAloneOrOnRetry(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := newQueueSelector(time.Minute)
	s.now = func() time.Time { return now }
	pick(s, queues("broker-a"), "", 4)
	both := queues("broker-a", "broker-b")

	if got, _ := pick(s, both, "", 20); got["broker-b"] != 0 {
		t.Errorf("new broker-b got %d of 20 first tries", got["broker-b"])
	}
	// A retry after broker-a failed goes to broker-b, settled or not.
	if got, _ := pick(s, both, "broker-a", 20); got["broker-b"] != 20 {
		t.Errorf("retries after broker-a: %v, want all on broker-b", got)
	}
	// A retry after broker-b failed goes to broker-a.
	if got, _ := pick(s, both, "broker-b", 20); got["broker-a"] != 20 {
		t.Errorf("retries after broker-b: %v, want all on broker-a", got)
	}
	// The only group left is used even when new or just failed.
	if got, _ := pick(s, queues("broker-c"), "", 4); got["broker-c"] != 4 {
		t.Errorf("only broker-c in the route: %v", got)
	}
	if got, _ := pick(s, queues("broker-c"), "broker-c", 4); got["broker-c"] != 4 {
		t.Errorf("only broker-c, retry after it failed: %v", got)
	}
	if q := s.Select(primitive.NewMessage("t", nil), nil, ""); q != nil {
		t.Errorf("no queues: got %v, want nil", q)
	}
}

func TestQueueSelector_TopicsAreTrackedApart(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := newQueueSelector(time.Minute)
	s.now = func() time.Time { return now }
	pick(s, queues("broker-a"), "", 4) // topic t knows only broker-a
	// Topic u's first route has both: both settled for u.
	mqs := queues("broker-a", "broker-b")
	msg := primitive.NewMessage("u", nil)
	per := map[string]int{}
	for range 16 {
		per[s.Select(msg, mqs, "").BrokerName]++
	}
	if per["broker-a"] != 8 || per["broker-b"] != 8 {
		t.Errorf("topic u: %v, want 8 each", per)
	}
}
