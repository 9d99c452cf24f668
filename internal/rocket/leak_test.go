package rocket_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rocket"
)

// clientLingerers are goroutines of rocketmq-client-go (at the version in
// go.mod) that outlive Shutdown and that nothing outside the library can
// stop. Each ends on its own:
//
//   - internal.(*rmqClient).Start.func1.1, .func1.3, .func1.4: the name
//     server refresh, heartbeat and offset persistence loops first sleep
//     10s, 1s and 10s with time.Sleep before they look at the done channel.
//   - consumer.(*pushConsumer).Start.func1.2: the expired-message cleaner
//     first sleeps ConsumeTimeout (15 minutes by default).
//   - consumer.(*statsItemSet).init.func4, .func5, .func6: each consumer's
//     statistics printers sleep until the next minute, hour and month
//     boundary before they look at their closed channel.
//   - remote.(*ResponseFuture).waitResponse: a request in flight at Shutdown
//     (a long-polling pull, or the send-back of a delivery the subscriber gave
//     back) waits for its own timeout, up to 30s: Shutdown drops the response
//     table without failing the waiting futures.
//   - remote.(*remotingClient).receiveResponse: the read loop of every client's
//     name server connection, which Shutdown never closes (namesrvs has its
//     own remoting client), and of a broker connection reopened by such an
//     in-flight request; each ends when the connection has been silent for
//     the client's ReadTimeout, 120s.
//   - go-cache's janitor: the package-level request/response future cache,
//     for the life of the process.
//
// The options below name each of these functions exactly. IgnoreAnyFunction
// is used where the goroutine sits in time.Sleep, because IgnoreTopFunction
// would then have to ignore every sleeping goroutine.
var clientLingerers = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).Start.func1.1"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).Start.func1.3"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).Start.func1.4"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*pushConsumer).Start.func1.2"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func4"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func5"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func6"),
	goleak.IgnoreTopFunction("github.com/apache/rocketmq-client-go/v2/internal/remote.(*ResponseFuture).waitResponse"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal/remote.(*remotingClient).receiveResponse"),
	goleak.IgnoreTopFunction("github.com/patrickmn/go-cache.(*janitor).Run"),
}

func TestClose_LeavesNoGoroutineBehind(t *testing.T) {
	e := setup(t)
	topic := brokertest.Topic(t)
	e.topic(t, topic)
	before := goleak.IgnoreCurrent()

	limits := rocket.TimerLimits(2*time.Second, localPrecision)
	pub, err := rocket.NewPublisher(context.Background(), e.config(limits))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := rocket.NewSubscriber(e.config(limits))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	m := &broker.Message{Topic: topic, Key: "leak-1", Payload: []byte("x"), DeliverAt: broker.MillisUTC(time.Now().Add(300 * time.Millisecond))}
	if err := pub.Publish(ctx, m); err != nil {
		t.Fatal(err)
	}
	// One delivery left blocked in its callback, unsettled, so Close has a
	// running callback to give back and wait for.
	select {
	case d := <-ch:
		if d.Message == nil || d.Message.Key != "leak-1" {
			t.Fatalf("unexpected delivery %+v", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery")
	}
	if err := sub.Close(); err != nil {
		t.Fatalf("Subscriber.Close: %v", err)
	}
	if _, ok := <-ch; ok {
		t.Fatal("channel still open after Close")
	}
	if err := pub.Close(); err != nil {
		t.Fatalf("Publisher.Close: %v", err)
	}
	// A pull loop the broker told to back off sleeps up to 30 s before
	// it sees the consumer stopped (consumer.(*pushConsumer).pullMessage):
	// wait for it to end rather than ignore it.
	opts := append(clientLingerers, before)
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		err := goleak.Find(opts...)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
}
