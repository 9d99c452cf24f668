package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// TestRun_TopologyMismatchIsLoudAndAnUnconsumedTopicShows is the issue's
// story: the relay runs with one prefix, a consumer comes with another.
// The relay logs the difference, a consumer that would disagree fails to
// announce itself naming both prefixes, and status and /metrics name the
// topic whose overdue tasks no live consumer reads.
func TestRun_TopologyMismatchIsLoudAndAnUnconsumedTopicShows(t *testing.T) {
	dsn := scratch(t)
	pool := openDSN(t, dsn)
	ctx := context.Background()
	if _, err := outbox.Schedule(ctx, pool, outbox.Task{Topic: "forgotten", Key: "k1", DueAt: time.Now().Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	published := time.Now().Add(-time.Hour).UnixMilli()
	if _, err := pool.Exec("UPDATE delay_task SET state = 'published', published_ms = ?", published); err != nil {
		t.Fatal(err)
	}
	flags := testenv.RabbitFlags(t)
	// A consumer that started first with the prefix "shop" (and was let
	// start anyway): the relay must say so when it starts.
	shop := broker.Topology{Broker: "rabbit", Settings: map[string]string{"prefix": "shop"}}
	early, err := outbox.Announce(ctx, pool, outbox.Presence{Instance: "shop-early", Role: outbox.RoleConsumer, Topology: shop, Topics: []string{"other"}},
		outbox.PresenceConfig{WarnOnly: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close(ctx) //nolint:errcheck

	addr := testenv.FreeAddr(t)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out, errOut syncBuffer
	root := newRootCmd()
	root.SetArgs(append([]string{"run", "--mysql-dsn", dsn, "--http", addr, "--no-scanner", "--stats-interval", "0"}, flags...))
	root.SetOut(&out)
	root.SetErr(&errOut)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(rctx) }()
	prefix := flags[len(flags)-3]
	if !testutil.Eventually(30*time.Second, 20*time.Millisecond, func() bool {
		return strings.Contains(errOut.String(), `prefix: \"`+prefix+`\" here, \"shop\" there`)
	}) {
		t.Fatalf("run logged no difference naming both prefixes; stderr %q", errOut.String())
	}
	// The relay logs the difference before it records itself: wait for
	// its record, which the next consumer is checked against.
	if !testutil.Eventually(30*time.Second, 20*time.Millisecond, func() bool {
		var n int
		return pool.QueryRow("SELECT COUNT(*) FROM delaybridge_presence WHERE role = ?", string(outbox.RoleRelay)).Scan(&n) == nil && n == 1
	}) {
		t.Fatal("run recorded no relay presence")
	}

	// A consumer arriving now with the prefix "shop" fails, naming both.
	_, err = outbox.Announce(ctx, pool, outbox.Presence{Role: outbox.RoleConsumer, Topology: shop, Topics: []string{"forgotten"}},
		outbox.PresenceConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if !errors.Is(err, outbox.ErrTopologyMismatch) || !strings.Contains(err.Error(), `prefix: "shop" here, "`+prefix+`" there`) {
		t.Fatalf("a consumer with another prefix announced itself: %v", err)
	}

	if st := mustRun(t, "status", "--mysql-dsn", dsn); !strings.Contains(st, "NO CONSUMER: topic forgotten has 1 overdue tasks") ||
		strings.Contains(st, "NO CONSUMER: topic other") {
		t.Fatalf("status does not name the unconsumed topic alone:\n%s", st)
	}
	var js struct {
		Unconsumed map[string]int `json:"unconsumed_overdue"`
		Overdue    int            `json:"overdue"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "status", "--json", "--mysql-dsn", dsn)), &js); err != nil || js.Unconsumed["forgotten"] != 1 || js.Overdue != 1 {
		t.Fatalf("status --json: %+v, %v", js, err)
	}
	if _, metrics := get(t, "http://"+addr+"/metrics"); !strings.Contains(metrics, `delaybridge_outbox_unconsumed_overdue_tasks{topic="forgotten"} 1`) {
		t.Fatalf("/metrics lacks the unconsumed topic:\n%s", metrics)
	}

	// A consumer of the topic with the relay's topology is welcome, and
	// the topic is no longer reported.
	rabbitTopo := broker.Topology{Broker: "rabbit", Settings: map[string]string{"prefix": prefix}}
	ok, err := outbox.Announce(ctx, pool, outbox.Presence{Role: outbox.RoleConsumer, Topology: rabbitTopo, Topics: []string{"forgotten"}},
		outbox.PresenceConfig{WarnOnly: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer ok.Close(ctx) //nolint:errcheck
	if st := mustRun(t, "status", "--mysql-dsn", dsn); strings.Contains(st, "NO CONSUMER") {
		t.Fatalf("status names a topic that has a consumer:\n%s", st)
	}
	cancel()
	waitStopped(t, done)
	var n int
	if err := pool.QueryRow("SELECT COUNT(*) FROM delaybridge_presence WHERE role = 'relay'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("the relay's presence outlived run: %d, %v", n, err)
	}
}
