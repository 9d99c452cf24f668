package rocket_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// Benchmarks against the local broker. Run them one at a time with
// -benchtime 1x; each reports its figures with ReportMetric:
//
//	go test -run '^$' -bench BenchmarkPublish_TimedVsPlain -benchtime 1x ./internal/rocket/
//	go test -run '^$' -bench BenchmarkLateness_1000DuePerSecond -benchtime 1x -timeout 10m ./internal/rocket/
//	go test -run '^$' -bench BenchmarkBurst_50000DueInOneSecond -benchtime 1x -timeout 10m ./internal/rocket/

const benchBatch = 1000

func benchPublish(b *testing.B, pub *rocket.Publisher, msgs []*broker.Message) time.Duration {
	b.Helper()
	start := time.Now()
	for i := 0; i < len(msgs); i += benchBatch {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := pub.Publish(ctx, msgs[i:min(i+benchBatch, len(msgs))]...)
		cancel()
		if err != nil {
			b.Fatalf("Publish: %v", err)
		}
	}
	return time.Since(start)
}

// BenchmarkPublish_TimedVsPlain sends the same number of plain and timed
// messages to one topic, alternating in rounds, and reports the confirmed
// rate of each and their ratio. The plain ones are due, so Publish sends
// them in batches; the timed ones go one a send.
func BenchmarkPublish_TimedVsPlain(b *testing.B) {
	e := setup(b)
	topic := brokertest.Topic(nil)
	pub, _ := e.clients(b, topic, rocket.TimerLimits(localTimerMaxDelay, localPrecision))
	const perRound = 20000
	var plainT, timedT time.Duration
	// Warm up the route and connections.
	benchPublish(b, pub, []*broker.Message{{Topic: topic, Key: "warm", DeliverAt: time.Now()}})
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		plain := make([]*broker.Message, perRound)
		timed := make([]*broker.Message, perRound)
		for i := range plain {
			plain[i] = &broker.Message{Topic: topic, Key: fmt.Sprintf("p-%d-%d", n, i), Payload: []byte("payload"), DeliverAt: broker.MillisUTC(time.Now())}
			// Timed messages due in 30-50 minutes, spread over many slots.
			timed[i] = &broker.Message{Topic: topic, Key: fmt.Sprintf("t-%d-%d", n, i), Payload: []byte("payload"), DeliverAt: broker.MillisUTC(time.Now().Add(30*time.Minute + time.Duration(i)*time.Millisecond*60))}
		}
		plainT += benchPublish(b, pub, plain)
		timedT += benchPublish(b, pub, timed)
	}
	b.StopTimer()
	total := float64(perRound * b.N)
	pr, tr := total/plainT.Seconds(), total/timedT.Seconds()
	b.ReportMetric(pr, "plain-msg/s")
	b.ReportMetric(tr, "timed-msg/s")
	b.ReportMetric(tr/pr, "timed/plain")
}

// lateRecorder records, for each handled message, how late (or early) its
// handler ran relative to DeliverAt.
type lateRecorder struct {
	mu      sync.Mutex
	late    []time.Duration
	seen    map[string]bool
	early   int
	handled atomic.Int64
	last    atomic.Int64 // unix nanos of the last first-time handling
}

func newLateRecorder(n int) *lateRecorder {
	return &lateRecorder{late: make([]time.Duration, 0, n), seen: make(map[string]bool, n)}
}

func (r *lateRecorder) handle(_ context.Context, m *broker.Message) error {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen[m.Key] {
		return nil
	}
	r.seen[m.Key] = true
	d := now.Sub(m.DeliverAt)
	if d < 0 {
		r.early++
	}
	r.late = append(r.late, d)
	r.handled.Add(1)
	r.last.Store(now.UnixNano())
	return nil
}

func (r *lateRecorder) wait(b *testing.B, n int, timeout time.Duration) {
	b.Helper()
	if !testutil.Eventually(timeout, 20*time.Millisecond, func() bool { return r.handled.Load() >= int64(n) }) {
		b.Fatalf("only %d of %d messages handled after %v", r.handled.Load(), n, timeout)
	}
}

func (r *lateRecorder) quantile(q float64) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := slices.Clone(r.late)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func startBenchConsumer(b *testing.B, e *env, topic string, h broker.Handler) *rocket.Publisher {
	b.Helper()
	pub, sub := e.clients(b, topic, rocket.TimerLimits(localTimerMaxDelay, localPrecision))
	c, err := broker.NewConsumer(sub, pub, h, broker.ConsumerConfig{Concurrency: 32})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Start(context.Background(), topic); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(context.Background()) })
	return pub
}

// BenchmarkLateness_1000DuePerSecond publishes, for 60 seconds, 1,000
// messages due each second, each 5 seconds ahead of its due time, and
// reports the handler's lateness (p50, p99, max) and how many ran early.
func BenchmarkLateness_1000DuePerSecond(b *testing.B) {
	e := setup(b)
	const rate, seconds, lead = 1000, 60, 5 * time.Second
	for n := 0; n < b.N; n++ {
		topic := brokertest.Topic(nil)
		r := newLateRecorder(rate * seconds)
		pub := startBenchConsumer(b, e, topic, r.handle)
		start := time.Now().Truncate(time.Second).Add(time.Second + lead)
		// Publish second k's messages at start+k-lead, as a relay would.
		for k := 0; k < seconds; k++ {
			if w := time.Until(start.Add(time.Duration(k)*time.Second - lead)); w > 0 {
				time.Sleep(w)
			}
			msgs := make([]*broker.Message, rate)
			for i := range msgs {
				due := start.Add(time.Duration(k)*time.Second + time.Duration(i)*time.Second/rate)
				msgs[i] = &broker.Message{Topic: topic, Key: fmt.Sprintf("l-%d-%d", k, i), Payload: []byte("p"), DeliverAt: broker.MillisUTC(due)}
			}
			benchPublish(b, pub, msgs)
		}
		r.wait(b, rate*seconds, lead+2*time.Minute)
		b.ReportMetric(float64(r.quantile(0.50).Milliseconds()), "p50-late-ms")
		b.ReportMetric(float64(r.quantile(0.99).Milliseconds()), "p99-late-ms")
		b.ReportMetric(float64(r.quantile(1).Milliseconds()), "max-late-ms")
		b.ReportMetric(float64(r.early), "early")
	}
}

// BenchmarkBurst_50000DueInOneSecond publishes 50,000 messages due within
// the same second and reports how long after that second began the last
// one was handled, and the drain rate.
func BenchmarkBurst_50000DueInOneSecond(b *testing.B) {
	e := setup(b)
	const n = 50000
	for it := 0; it < b.N; it++ {
		topic := brokertest.Topic(nil)
		r := newLateRecorder(n)
		pub := startBenchConsumer(b, e, topic, r.handle)
		due := time.Now().Truncate(time.Second).Add(40 * time.Second)
		msgs := make([]*broker.Message, n)
		for i := range msgs {
			msgs[i] = &broker.Message{Topic: topic, Key: fmt.Sprintf("b-%d", i), Payload: []byte("p"), DeliverAt: broker.MillisUTC(due.Add(time.Duration(i) * time.Second / n))}
		}
		took := benchPublish(b, pub, msgs)
		if time.Now().After(due) {
			b.Fatalf("publishing %d messages took %v, past their due time; raise the lead", n, took)
		}
		b.Logf("published %d timed messages in %v", n, took)
		r.wait(b, n, 5*time.Minute)
		drain := time.Unix(0, r.last.Load()).Sub(due)
		b.ReportMetric(drain.Seconds(), "s-to-drain")
		b.ReportMetric(float64(n)/drain.Seconds(), "handled/s")
		b.ReportMetric(float64(r.quantile(0.99).Milliseconds()), "p99-late-ms")
		b.ReportMetric(float64(r.early), "early")
	}
}
