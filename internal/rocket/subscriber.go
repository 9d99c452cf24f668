package rocket

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// Subscriber delivers the messages of RocketMQ topics to the broker
// package's runtime. It implements broker.Subscriber.
//
// Each Subscribe starts one push consumer in clustering mode, in consumer
// group GroupPrefix+"-"+topic: every subscriber of a topic with the same
// prefix, in this process or another, competes for its messages. The
// consumer hands the runtime one message per client callback and holds the
// callback until the runtime settles the delivery: Ack consumes the message,
// Nack gives it back through the group's retry topic, from which the broker
// redelivers it to the group about a second later (the broker's first delay
// level). The broker's own retry schedule and dead-letter queue are not
// used for handler failures: the runtime retries by publishing again with
// its own backoff and dead-letters through its DeadLetter.
//
// One limitation comes from the client: the broker creates a group's retry
// topic when the group's first consumer registers, after that consumer
// looked its routes up, so a consumer of a brand-new group learns the retry
// topic only at its next route refresh, 30 s later, and a delivery it gives
// back before then returns after 30 to 40 s rather than about one. Every
// consumer started after the first one registered, including after a
// restart, sees the retry topic at once. Subscriber.CreateTopic creates the
// retry topic together with the topic, so even the first consumer sees it
// (or ops run mqadmin updateTopic -t %RETRY%<group> -c <cluster>).
//
// When the subscription's context ends or the Subscriber is closed, the
// consumer stops handing out messages, gives back every delivery not yet
// settled, waits for all its client callbacks to return, closes the channel
// and only then shuts the client down. (The client's own Shutdown does not
// wait for running callbacks.)
type Subscriber struct {
	cfg Config

	mu     sync.Mutex
	closed bool
	subs   map[*subscription]struct{}

	retryRouted sync.Map // topic -> struct{}: CreateTopic made the group's retry topic
}

// NewSubscriber returns a Subscriber on cfg.NameServers. Close it with Close.
func NewSubscriber(cfg Config) (*Subscriber, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	installClientLog()
	return &Subscriber{cfg: cfg, subs: map[*subscription]struct{}{}}, nil
}

// Group returns the consumer group a subscription to topic consumes in.
func (s *Subscriber) Group(topic string) string { return s.cfg.GroupPrefix + "-" + topic }

// Subscribe starts a push consumer for topic and returns its deliveries. It
// returns once the consumer has asked the broker for its share of the
// topic's queues. The topic must exist (see CreateTopic and
// Subscriber.CreateTopic).
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *broker.Delivery, error) {
	if err := broker.ValidateTopic(topic); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, broker.ErrClosed
	}
	s.mu.Unlock()

	// The allocation strategy is the one public place where the client
	// shows that a rebalance gave this consumer its share of a topic. Wait
	// for the topic and, when it is known to be routed, the group's retry
	// topic: the first rebalance then got past both, and the client's own
	// requests in it happened before Subscribe returned (see shutdown).
	want := map[string]bool{topic: true}
	if _, ok := s.retryRouted.Load(topic); ok {
		want[retryTopicPrefix+s.Group(topic)] = true
	}
	assigned := make(chan struct{})
	var allocMu sync.Mutex
	allocate := func(group, cid string, mqAll []*primitive.MessageQueue, cidAll []string) []*primitive.MessageQueue {
		mine := consumer.AllocateByAveragely(group, cid, mqAll, cidAll)
		if len(mqAll) > 0 {
			allocMu.Lock()
			if want[mqAll[0].Topic] {
				delete(want, mqAll[0].Topic)
				if len(want) == 0 {
					close(assigned)
				}
			}
			allocMu.Unlock()
		}
		return mine
	}
	pc, err := consumer.NewPushConsumer(append(clientOptions(s.cfg, consumer.WithCredentials, consumer.WithTls),
		consumer.WithNameServer(s.cfg.NameServers),
		consumer.WithGroupName(s.Group(topic)),
		consumer.WithInstance(instanceName("sub")),
		consumer.WithConsumerModel(consumer.Clustering),
		// A group with no offset yet starts at the first message the
		// broker still has: a task published before its consumers first
		// connected is delivered, not skipped. (While that message is in
		// the broker's memory the broker answers so itself, whatever the
		// client asks.)
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithConsumeMessageBatchMaxSize(1),
		consumer.WithConsumeGoroutineNums(s.cfg.ConsumeGoroutines),
		consumer.WithConsumeTimeout(s.cfg.ConsumeTimeout),
		// Nacks happen on shutdown, while the broker refuses re-publishes
		// and while the handler's database is unavailable, a second apart:
		// never let the broker's own dead-letter queue take a message the
		// runtime still owns (10,000 give-backs are hours of outage).
		consumer.WithMaxReconsumeTimes(maxReconsumeTimes),
		consumer.WithStrategy(allocate),
	)...)
	if err != nil {
		return nil, fmt.Errorf("rocket: new push consumer for %s: %w", topic, err)
	}
	sub := &subscription{
		topic: topic,
		pc:    pc,
		log:   s.cfg.Logger,
		out:   make(chan *broker.Delivery),
		stop:  make(chan struct{}),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	if err := pc.Subscribe(topic, consumer.MessageSelector{}, sub.consume); err != nil {
		_ = pc.Shutdown()
		return nil, fmt.Errorf("rocket: subscribe %s: %w", topic, err)
	}
	if err := pc.Start(); err != nil {
		// Start shuts the consumer down itself when the topic has no route.
		_ = pc.Shutdown()
		return nil, fmt.Errorf("rocket: start consumer for %s (group %s): %w", topic, s.Group(topic), err)
	}
	// Start rebalances in the background. Wait for that first rebalance, so
	// the consumer has claimed its queues and started pulling when
	// Subscribe returns, rather than a few seconds later. (Calling the
	// client's Rebalance here instead would race with its own.)
	wait := time.NewTimer(s.cfg.AssignWait)
	select {
	case <-assigned:
	case <-wait.C:
		s.cfg.Logger.Warn("rocket: no queues assigned yet; the consumer keeps trying in the background", "topic", topic, "group", s.Group(topic), "waited", s.cfg.AssignWait)
	case <-ctx.Done():
	}
	wait.Stop()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sub.shutdown()
		return nil, broker.ErrClosed
	}
	s.subs[sub] = struct{}{}
	s.mu.Unlock()

	go func() {
		select {
		case <-ctx.Done():
		case <-sub.quit:
		}
		sub.shutdown()
		s.mu.Lock()
		delete(s.subs, sub)
		s.mu.Unlock()
		close(sub.done)
	}()
	return sub.out, nil
}

// rebalanceSettle is how long shutdown lets a rebalance under way finish
// before it closes the client.
const rebalanceSettle = 200 * time.Millisecond

// maxReconsumeTimes keeps the broker from moving a message the runtime
// gave back many times to its %DLQ% topic.
const maxReconsumeTimes = 10000

// Close ends every subscription as its context ending would and waits until
// each has given back its unsettled deliveries and shut its client down.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.closed = true
	subs := make([]*subscription, 0, len(s.subs))
	for sub := range s.subs {
		subs = append(subs, sub)
	}
	s.mu.Unlock()
	var errs []error
	for _, sub := range subs {
		sub.quitOnce.Do(func() { close(sub.quit) })
		<-sub.done
		errs = append(errs, sub.shutdownErr)
	}
	return errors.Join(errs...)
}

// subscription is one push consumer and the channel it feeds.
type subscription struct {
	topic string
	pc    interface {
		Suspend()
		Shutdown() error
	}
	log      *slog.Logger
	out      chan *broker.Delivery
	stop     chan struct{} // closed when the subscription stops taking messages
	quit     chan struct{} // closed by Subscriber.Close
	quitOnce sync.Once
	done     chan struct{} // closed when shutdown finished

	mu          sync.Mutex
	stopping    bool
	callbacks   sync.WaitGroup
	shutdownErr error
}

// consume is the client's callback for one message (batch size 1).
func (s *subscription) consume(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return retryLater(ctx), nil
	}
	s.callbacks.Add(1)
	s.mu.Unlock()
	defer s.callbacks.Done()
	for _, m := range msgs {
		if !s.deliver(m) {
			return retryLater(ctx), nil
		}
	}
	return consumer.ConsumeSuccess, nil
}

// retryLater gives the message back through the retry topic at the
// broker's first delay level rather than its default of level 3 plus the
// number of earlier retries.
func retryLater(ctx context.Context) consumer.ConsumeResult {
	if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok {
		cc.DelayLevelWhenNextConsume = 1
	}
	return consumer.ConsumeRetryLater
}

// deliver hands m to the runtime and waits until it is settled or the
// subscription stops. It reports whether m was acked.
func (s *subscription) deliver(m *primitive.MessageExt) bool {
	props := m.GetProperties()
	body := m.Body
	if props[propEmptyBody] == "1" {
		body = nil
	}
	a := &acker{result: make(chan bool, 1)}
	d := &broker.Delivery{Headers: props, Body: body, Acker: a}
	d.Message, d.Err = broker.Decode(props, body)
	select {
	case s.out <- d:
	case <-s.stop:
		return false
	}
	select {
	case ok := <-a.result:
		return ok
	case <-s.stop:
		return a.abandon()
	}
}

// shutdown stops taking messages, gives back what is unsettled, waits for
// every callback, closes the channel, then shuts the client down.
func (s *subscription) shutdown() {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return
	}
	s.stopping = true
	close(s.stop)
	s.mu.Unlock()
	s.callbacks.Wait()
	close(s.out)
	// The broker tells every consumer of the group to rebalance whenever
	// one joins or leaves, this one included (also when Shutdown
	// unregisters it). A rebalance running while Shutdown closes the client
	// races with it inside the client (rmqClient.close is a plain bool, read
	// by every request). A suspended consumer skips new rebalances; the
	// pause lets one already under way finish its few requests. The
	// rebalance Start runs ignores the pause; Subscribe waited for it.
	s.pc.Suspend()
	time.Sleep(rebalanceSettle)
	if err := s.pc.Shutdown(); err != nil {
		s.shutdownErr = fmt.Errorf("rocket: shut down consumer for %s: %w", s.topic, err)
		s.log.Warn("rocket: consumer shutdown failed", "topic", s.topic, "err", err)
	}
}

// acker settles one delivery by unblocking its callback.
type acker struct {
	mu     sync.Mutex
	state  ackState
	result chan bool
}

type ackState int

const (
	pending ackState = iota
	acked
	nacked
	givenBack
)

var (
	errSettled = errors.New("rocket: delivery already settled")
	// errGivenBack matches broker.ErrClosed: the subscription ended and
	// gave the delivery back to the broker on its own.
	errGivenBack = fmt.Errorf("rocket: delivery already given back, the subscription ended: %w", broker.ErrClosed)
)

func (a *acker) settle(ok bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch a.state {
	case pending:
	case givenBack:
		return errGivenBack
	default:
		return errSettled
	}
	if ok {
		a.state = acked
	} else {
		a.state = nacked
	}
	a.result <- ok
	return nil
}

// abandon marks a pending delivery given back and reports whether it had
// been acked before the subscription stopped.
func (a *acker) abandon() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state == pending {
		a.state = givenBack
	}
	return a.state == acked
}

// Ack consumes the message.
func (a *acker) Ack() error { return a.settle(true) }

// Nack gives the message back for redelivery to the group.
func (a *acker) Nack() error { return a.settle(false) }
