package rocket_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// restartBroker stops the local RocketMQ broker that scripts/services.sh
// started with SIGTERM (so its shutdown hooks flush the store), runs
// whileDown, and starts it again with `scripts/services.sh up`, which
// returns once the broker is registered with the name server again.
func restartBroker(t *testing.T, whileDown func()) {
	t.Helper()
	stopStart := time.Now()
	testenv.RocketStopBroker(t, syscall.SIGTERM)
	t.Logf("restart: broker stopped %v after SIGTERM", time.Since(stopStart).Round(time.Millisecond))
	whileDown()
	upStart := time.Now()
	testenv.ServicesUp(t)
	t.Logf("restart: broker back up (services.sh up took %v)", time.Since(upStart).Round(time.Millisecond))
}

func TestBrokerRestart_PendingTimerMessagesAllArriveNoneEarly(t *testing.T) {
	testenv.SkipIfShort(t, "restarts the shared local broker")
	e := setup(t)
	topic := brokertest.Topic(t)
	pub, sub := e.clients(t, topic, rocket.TimerLimits(localTimerMaxDelay, localPrecision))

	var mu sync.Mutex
	handled := map[string]time.Time{}
	h := func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := handled[m.Key]; !ok {
			handled[m.Key] = time.Now()
		}
		return nil
	}
	c, err := broker.NewConsumer(sub, pub, h, broker.ConsumerConfig{Concurrency: 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })

	// Due between 3s and 60s from now: some before the broker stops, some
	// while it is down or restarting, the rest after it is back.
	const n = 300
	now := time.Now()
	msgs := make([]*broker.Message, n)
	for i := range msgs {
		d := 3*time.Second + time.Duration(i)*57*time.Second/n
		msgs[i] = &broker.Message{Topic: topic, Key: fmt.Sprintf("r-%d", i), Payload: []byte("p"), DeliverAt: broker.MillisUTC(now.Add(d))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, msgs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}

	pendingAtStop := 0
	restartBroker(t, func() {
		mu.Lock()
		pendingAtStop = n - len(handled)
		mu.Unlock()
	})
	if pendingAtStop == 0 {
		t.Fatal("every message was handled before the broker stopped; the test proves nothing")
	}
	t.Logf("%d of %d timer messages were pending when the broker stopped", pendingAtStop, n)

	var got int
	if !testutil.Eventually(120*time.Second, 200*time.Millisecond, func() bool {
		mu.Lock()
		defer mu.Unlock()
		got = len(handled)
		return got == n
	}) {
		t.Fatalf("%d of %d messages never arrived after the restart", n-got, n)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range msgs {
		if at := handled[m.Key]; at.Before(m.DeliverAt) {
			t.Errorf("%s handled %v early", m.Key, m.DeliverAt.Sub(at))
		}
	}
}
