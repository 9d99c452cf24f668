package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// Scrapes that arrive while the outbox is being read wait for that read and
// report its result: ten concurrent scrapes cost one set of queries.
func TestOutboxCollector_ConcurrentScrapesShareOneRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var reads, running, most atomic.Int32
		c := &outboxCollector{log: slog.New(slog.DiscardHandler), read: func(ctx context.Context, now time.Time) (*ops.Stats, error) {
			reads.Add(1)
			n := running.Add(1)
			defer running.Add(-1)
			if n > most.Load() {
				most.Store(n)
			}
			<-gate
			return &ops.Stats{Dead: 7}, nil
		}}
		reg := prometheus.NewRegistry()
		reg.MustRegister(c)
		const scrapes = 10
		var wg sync.WaitGroup
		ups := make(chan float64, scrapes)
		for range scrapes {
			wg.Go(func() {
				mfs, err := reg.Gather()
				if err != nil {
					t.Error(err)
				}
				for _, mf := range mfs {
					if mf.GetName() == "delaybridge_outbox_up" {
						ups <- mf.GetMetric()[0].GetGauge().GetValue()
					}
				}
			})
		}
		synctest.Wait() // every scrape is reading or waiting for the read
		close(gate)
		wg.Wait()
		close(ups)
		if reads.Load() != 1 || most.Load() != 1 {
			t.Fatalf("%d scrapes made %d reads, %d at once; want 1", scrapes, reads.Load(), most.Load())
		}
		n := 0
		for up := range ups {
			n++
			if up != 1 {
				t.Fatalf("a scrape reported delaybridge_outbox_up %v", up)
			}
		}
		if n != scrapes {
			t.Fatalf("%d of %d scrapes reported delaybridge_outbox_up", n, scrapes)
		}
		// The next scrape after the shared one reads again.
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
		if reads.Load() != 2 {
			t.Fatalf("a later scrape reused an old read: %d reads", reads.Load())
		}
	})
}

func TestListenHTTP_WarnsOnlyBeyondLoopback(t *testing.T) {
	for addr, warn := range map[string]bool{"127.0.0.1:0": false, "[::1]:0": false, "0.0.0.0:0": true} {
		var logs bytes.Buffer
		a := &app{log: slog.New(slog.NewTextHandler(&logs, nil))}
		ln, err := a.listenHTTP(addr)
		if err != nil {
			if strings.HasPrefix(addr, "[::1]") {
				continue // no IPv6 here
			}
			t.Fatal(err)
		}
		ln.Close()
		if got := strings.Contains(logs.String(), "listens beyond loopback"); got != warn {
			t.Errorf("listen on %s: warned %v, want %v\n%s", addr, got, warn, logs.String())
		}
	}
}

// The task series come with the age of the count behind them, and before
// any count exists they are absent, not zeros that read as an empty outbox.
func TestOutboxCollector_ExportsCountsWithTheirAgeOrNotAtAll(t *testing.T) {
	for _, tc := range []struct {
		name     string
		st       *ops.Stats
		wantAge  float64
		wantSeen bool
	}{
		{"no summary yet", &ops.Stats{Backlog: map[outbox.State]map[string]int{}, Overdue: 2}, 0, false},
		{"a 90s old summary", &ops.Stats{Backlog: map[outbox.State]map[string]int{outbox.StatePending: {"t": 5}},
			CountsAt: time.Now().Add(-90 * time.Second), CountsAge: 90 * time.Second}, 90, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &outboxCollector{log: slog.New(slog.DiscardHandler), read: func(context.Context, time.Time) (*ops.Stats, error) { return tc.st, nil }}
			reg := prometheus.NewRegistry()
			reg.MustRegister(c)
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					got[mf.GetName()] += m.GetGauge().GetValue()
				}
			}
			age, seenAge := got["delaybridge_outbox_stats_age_seconds"]
			_, seenTasks := got["delaybridge_outbox_tasks"]
			_, seenFinished := got["delaybridge_outbox_finished_tasks"]
			if seenAge != tc.wantSeen || seenTasks != tc.wantSeen || seenFinished != tc.wantSeen || age != tc.wantAge {
				t.Fatalf("age %v (exported %v), tasks exported %v, finished exported %v; want exported %v, age %v",
					age, seenAge, seenTasks, seenFinished, tc.wantSeen, tc.wantAge)
			}
			if got["delaybridge_outbox_up"] != 1 || got["delaybridge_outbox_overdue_tasks"] != float64(tc.st.Overdue) {
				t.Fatalf("up %v overdue %v", got["delaybridge_outbox_up"], got["delaybridge_outbox_overdue_tasks"])
			}
		})
	}
}
