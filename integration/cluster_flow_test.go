package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
)

// relayAndScan runs a relay (cfg, polling every 50 ms when idle, publishes
// bounded to 5 s) and a scanner with grace over f's database until the
// test ends: the daemon a cluster test kills a broker under.
func (f *flow) relayAndScan(t testing.TB, pub broker.Publisher, cfg outbox.RelayConfig, grace time.Duration) {
	t.Helper()
	cfg.Logger, cfg.IdleMax, cfg.PublishTimeout = quiet(), 50*time.Millisecond, 5*time.Second
	r, err := outbox.NewRelay(f.db, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := scanner.New(f.db, pub, scanner.Config{Logger: quiet(), Grace: grace, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{r.Run, sc.Run} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = run(ctx) }()
	}
	t.Cleanup(func() { stop(); wg.Wait() })
}

// orderStream is the order service of a cluster test: 40 orders a second,
// order i due dueIn(i) after it was placed, until stop.
type orderStream struct {
	mu      sync.Mutex
	due     map[string]time.Time
	created map[string]time.Time
	n       atomic.Int64

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startOrders starts placing orders keyed prefix-000001, prefix-000002, ….
func (f *flow) startOrders(t testing.TB, prefix string, dueIn func(i int64) time.Duration) *orderStream {
	ctx, cancel := context.WithCancel(context.Background())
	o := &orderStream{due: map[string]time.Time{}, created: map[string]time.Time{}, cancel: cancel}
	t.Cleanup(o.stop)
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			i := o.n.Load() + 1
			key := fmt.Sprintf("%s-%06d", prefix, i)
			now := time.Now()
			at := now.Add(dueIn(i))
			if err := f.tryOrder(key, at); err != nil {
				t.Errorf("order %s: %v", key, err)
				return
			}
			o.n.Store(i)
			o.mu.Lock()
			o.due[key], o.created[key] = at, now
			o.mu.Unlock()
		}
	}()
	return o
}

// stop stops placing orders; it may be called again.
func (o *orderStream) stop() {
	o.cancel()
	o.wg.Wait()
}

// total is how many orders were placed.
func (o *orderStream) total() int { return int(o.n.Load()) }

// times returns when the order key was placed and when its task is due.
func (o *orderStream) times(key string) (created, due time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.created[key], o.due[key]
}
