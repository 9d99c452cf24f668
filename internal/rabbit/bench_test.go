package rabbit

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// benchSetup is setup for benchmarks: the default ladder (100ms × 26
// levels) under a fresh prefix, deleted afterwards.
func benchSetup(b *testing.B) *bundle {
	b.Helper()
	url := testenv.AMQP(b)
	prefix := testenv.Name("dbbench")
	bb := &bundle{tb: b, top: map[string]bool{}, cfg: Config{URL: url, Prefix: prefix, ConnectionName: prefix}}
	b.Cleanup(bb.deleteTopology)
	return bb
}

func benchMessages(topic string, n int, delay time.Duration) []*broker.Message {
	due := broker.MillisUTC(time.Now().Add(delay))
	msgs := make([]*broker.Message, n)
	for i := range msgs {
		msgs[i] = &broker.Message{Topic: topic, Key: "order-" + strconv.Itoa(i), Payload: []byte(`{"order":42,"action":"cancel"}`), DeliverAt: due}
	}
	return msgs
}

// BenchmarkConfirmedPublish compares a confirmed publish into the ladder
// (Publisher, two channels of 500, eight callers of 250 messages, each due
// in a minute) with a raw confirmed publish of the same messages (same
// envelope headers and body) on one channel to one quorum queue, both
// keeping up to 1000 messages unconfirmed; publisher-no-delay is the same
// Publisher straight to the topic's queue. The box it runs on is shared, so
// compare runs of one invocation and take the median of several:
//
//	go test -run '^$' -bench ConfirmedPublish -benchtime 50000x -count 1 ./internal/rabbit/
func BenchmarkConfirmedPublish(b *testing.B) {
	b.Run("raw-quorum", func(b *testing.B) {
		bb := benchSetup(b)
		conn, err := amqp.Dial(bb.cfg.URL)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		q := bb.cfg.Prefix + ".raw"
		if _, err := ch.QueueDeclare(q, true, false, false, false, quorum(nil)); err != nil {
			b.Fatal(err)
		}
		defer func() { _, _ = ch.QueueDelete(q, false, false, false) }()
		if err := ch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		const window = DefaultConfirmWindow
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window+1))
		msgs := benchMessages("raw", b.N, time.Minute)
		b.ResetTimer()
		start := time.Now()
		inflight, nacks := 0, 0
		for _, m := range msgs {
			if inflight == window {
				if c := <-confirms; !c.Ack {
					nacks++
				}
				inflight--
			}
			err := ch.PublishWithContext(context.Background(), "", q, true, false, amqp.Publishing{
				Headers: envelopeTable(m, 0), ContentType: "application/octet-stream",
				DeliveryMode: amqp.Persistent, Body: m.Payload, MessageId: m.Key, Timestamp: time.Now(),
			})
			if err != nil {
				b.Fatal(err)
			}
			inflight++
		}
		for ; inflight > 0; inflight-- {
			if c := <-confirms; !c.Ack {
				nacks++
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
		if nacks > 0 {
			b.Fatalf("%d nacks", nacks)
		}
	})
	b.Run("ladder", func(b *testing.B) { benchPublisher(b, time.Minute) })
	// The same Publisher with no delay, straight to the topic's queue: how
	// much of the gap is the client rather than the ladder.
	b.Run("publisher-no-delay", func(b *testing.B) { benchPublisher(b, 0) })
}

func benchPublisher(b *testing.B, delay time.Duration) {
	{
		bb := benchSetup(b)
		bb.topic("bench")
		// Two channels of 500: the same 1000 unconfirmed as the raw run.
		bb.cfg.Channels, bb.cfg.ConfirmWindow = 2, DefaultConfirmWindow/2
		pub, err := NewPublisher(context.Background(), bb.cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		// 1 minute = 600 units: one hop into level 9, so nothing expires
		// while we measure.
		msgs := benchMessages("bench", b.N, delay)
		if err := pub.Publish(context.Background(), msgs[0]); err != nil { // declares the topic
			b.Fatal(err)
		}
		// Several callers keep the shared window full, as a relay with
		// parallel batches does.
		const callers, batch = 8, 250
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		b.ResetTimer()
		start := time.Now()
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(batch)) - batch
					if i >= len(msgs) {
						return
					}
					if err := pub.Publish(context.Background(), msgs[i:min(i+batch, len(msgs))]...); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
}

// BenchmarkLateness runs the consumer runtime with a no-op handler over the
// default ladder while messages come due at a steady rate, each published
// 5s ahead (less the 200ms lead, 47 to 48 units: two to five levels), and reports
// lateness (handled − due) percentiles and the number handled early.
// DELAYBRIDGE_BENCH_SECONDS (default 60) and DELAYBRIDGE_BENCH_RATE
// (default 1000/s) shape the run; run it once:
//
//	go test -run '^$' -bench Lateness -benchtime 1x -timeout 10m ./internal/rabbit/
func BenchmarkLateness(b *testing.B) {
	seconds := testenv.EnvInt("DELAYBRIDGE_BENCH_SECONDS", 60)
	rate := testenv.EnvInt("DELAYBRIDGE_BENCH_RATE", 1000)
	const ahead = 5 * time.Second
	for range b.N {
		bb := benchSetup(b)
		topic := "late"
		bb.topic(topic)
		pub, err := NewPublisher(context.Background(), bb.cfg)
		if err != nil {
			b.Fatal(err)
		}
		sub, err := NewSubscriber(bb.cfg)
		if err != nil {
			b.Fatal(err)
		}
		var mu sync.Mutex
		var late []time.Duration
		early := 0
		total := seconds * rate
		done := make(chan struct{})
		handler := func(_ context.Context, m *broker.Message) error {
			l := time.Since(m.DeliverAt)
			mu.Lock()
			if l < 0 {
				early++
			}
			late = append(late, l)
			if len(late) == total {
				close(done)
			}
			mu.Unlock()
			return nil
		}
		c, err := broker.NewConsumer(sub, pub, handler, broker.ConsumerConfig{Concurrency: 16})
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Start(context.Background(), topic); err != nil {
			b.Fatal(err)
		}
		// Every 100ms publish the messages due in a 100ms slot 5s from now,
		// spread evenly over the slot.
		perTick := rate / 10
		tick := time.NewTicker(100 * time.Millisecond)
		start := time.Now().Add(ahead).Truncate(100 * time.Millisecond)
		for s := 0; s < seconds*10; s++ {
			slot := start.Add(time.Duration(s) * 100 * time.Millisecond)
			msgs := make([]*broker.Message, perTick)
			for i := range msgs {
				due := slot.Add(time.Duration(i) * 100 * time.Millisecond / time.Duration(perTick))
				msgs[i] = &broker.Message{Topic: topic, Key: fmt.Sprintf("m-%d-%d", s, i), DeliverAt: broker.MillisUTC(due)}
			}
			if err := pub.Publish(context.Background(), msgs...); err != nil {
				b.Fatal(err)
			}
			<-tick.C
		}
		tick.Stop()
		select {
		case <-done:
		case <-time.After(ahead + 60*time.Second):
			mu.Lock()
			n := len(late)
			mu.Unlock()
			b.Fatalf("only %d of %d handled", n, total)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = c.Close(ctx)
		cancel()
		_ = sub.Close()
		_ = pub.Close()
		mu.Lock()
		slices.Sort(late)
		q := func(p float64) float64 { return float64(late[int(p*float64(len(late)-1))]) / float64(time.Millisecond) }
		b.ReportMetric(q(0.50), "p50-ms")
		b.ReportMetric(q(0.90), "p90-ms")
		b.ReportMetric(q(0.99), "p99-ms")
		b.ReportMetric(q(0.999), "p99.9-ms")
		b.ReportMetric(q(1), "max-ms")
		b.ReportMetric(float64(early), "early")
		b.ReportMetric(float64(len(late)), "handled")
		mu.Unlock()
	}
}

// BenchmarkHop measures how fast the broker's at-least-once dead-letter
// worker moves messages one hop: DELAYBRIDGE_BENCH_HOP_N (default 30000)
// messages are published into level 0 (TTL 5s) of a 5s ladder, expire as
// fast as they were published, and the rate is counted as they reach the
// topic queue. The live
// dead_letter_worker_consumer_prefetch is reported alongside.
//
//	go test -run '^$' -bench Hop -benchtime 1x ./internal/rabbit/
func BenchmarkHop(b *testing.B) {
	n := testenv.EnvInt("DELAYBRIDGE_BENCH_HOP_N", 30000)
	prefetch := "unknown"
	if out, err := execRabbitmqctl("environment"); err == nil {
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "dead_letter_worker_consumer_prefetch") {
				prefetch = strings.Trim(strings.TrimSpace(line), "{},")
			}
		}
	}
	b.Logf("broker: %s", prefetch)
	for range b.N {
		bb := benchSetup(b)
		bb.cfg.Unit, bb.cfg.Depth = 5*time.Second, 2
		topic := "hop"
		bb.topic(topic)
		pub, err := NewPublisher(context.Background(), bb.cfg)
		if err != nil {
			b.Fatal(err)
		}
		conn, err := amqp.Dial(bb.cfg.URL)
		if err != nil {
			b.Fatal(err)
		}
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if err := pub.Publish(context.Background(), benchMessages(topic, 1, 0)...); err != nil {
			b.Fatal(err)
		}
		if _, err := ch.QueuePurge(bb.topicQueue(topic), false); err != nil {
			b.Fatal(err)
		}
		// All n enter level 0 (TTL 5s) within about a second and expire
		// as fast as they were published; the hop rate is only measured
		// truly when the worker is slower than that publish rate.
		msgs := benchMessages(topic, n, 6*time.Second)
		pubStart := time.Now()
		for i := 0; i < n; i += 5000 {
			if err := pub.Publish(context.Background(), msgs[i:min(i+5000, n)]...); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n)/time.Since(pubStart).Seconds(), "publish-msg/s")
		var first time.Time
		var hopped int
		if !testutil.Eventually(5*time.Minute, 5*time.Millisecond, func() bool {
			q, err := ch.QueueDeclarePassive(bb.topicQueue(topic), true, false, false, false, quorum(nil))
			if err != nil {
				b.Fatal(err)
			}
			if q.Messages > 0 && first.IsZero() {
				first = time.Now()
			}
			hopped = q.Messages
			return hopped >= n
		}) {
			b.Fatalf("only %d of %d hopped", hopped, n)
		}
		if time.Since(pubStart) < 5*time.Second {
			b.Fatal("the messages left level 0 before its 5s TTL: they did not go through the ladder")
		}
		b.ReportMetric(float64(n)/time.Since(first).Seconds(), "hop-msg/s")
		_ = conn.Close()
		_ = pub.Close()
	}
}

func (b *bundle) topicQueue(topic string) string { return topology{cfg: b.cfg}.topicQueue(topic) }
