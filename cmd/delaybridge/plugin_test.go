package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

func TestDemo_HoldsItsInvariantsInDelayedExchangeMode(t *testing.T) {
	testenv.DelayedPlugin(t)
	_, dsn := testenv.ScratchDB(t)
	out := mustRun(t, append([]string{"demo", "--mysql-dsn", dsn, "--orders", "80", "--timeout", "2s", "--spread", "1s", "--json", "--log-level", "error"},
		append(testenv.RabbitFlags(t), "--rabbit-mode", "delayed-exchange")...)...)
	m := lastJSON(t, out)
	if m["broker"] != "rabbit" || m["mode"] != "delayed-exchange" || m["orders"] != 80.0 || m["wrongly_cancelled"] != 0.0 || m["left_unpaid"] != 0.0 || m["early"] != 0.0 ||
		m["stock_ok"] != true || m["paid"].(float64)+m["cancelled"].(float64) != 80 {
		t.Fatalf("demo summary %v", m)
	}
}

func TestDoctor_DelayedExchangeModeSaysWhatThePluginDoesNotPromise(t *testing.T) {
	testenv.DelayedPlugin(t)
	dsn := scratch(t)
	out := mustRun(t, append([]string{"doctor", "--mysql-dsn", dsn}, append(testenv.RabbitFlags(t), "--rabbit-mode", "delayed-exchange")...)...)
	for _, want := range []string{"OK    delayed-message plugin present: delayed-exchange mode works", "WARN  delayed-exchange mode: the plugin keeps waiting messages in a Mnesia table on one node, not replicated",
		"WARN  delayed-exchange mode: the plugin routes a message only when it is due, so publishing cannot ask for mandatory returns",
		"WARN  delayed-exchange mode is deprecated: the delayed-message plugin was archived upstream", "delivered early", "0 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
	out = mustRun(t, append([]string{"doctor", "--mysql-dsn", dsn}, testenv.RabbitFlags(t)...)...)
	if !strings.Contains(out, "OK    delayed-message plugin present (delayed-exchange mode possible; ladder mode needs no plugin)") || strings.Contains(out, "Mnesia") || strings.Contains(out, "deprecated") {
		t.Errorf("doctor in ladder mode:\n%s", out)
	}
}

// run in delayed-exchange mode says once, when it starts, that the plugin
// is retired and where the way off it is, and relays all the same.
func TestRun_DelayedExchangeModeWarnsOnceThatThePluginIsRetired(t *testing.T) {
	testenv.DelayedPlugin(t)
	dsn := scratch(t)
	pool := openDSN(t, dsn)
	if _, err := outbox.Schedule(context.Background(), pool, outbox.Task{Topic: "plugin-run", Key: "k", DueAt: time.Now().Add(2 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	root := newRootCmd()
	root.SetArgs(append([]string{"run", "--mysql-dsn", dsn, "--http", testenv.FreeAddr(t), "--log-level", "warn"},
		append(testenv.RabbitFlags(t), "--rabbit-mode", "delayed-exchange")...))
	root.SetOut(&out)
	root.SetErr(&errOut)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	if !testutil.Eventually(30*time.Second, 50*time.Millisecond, func() bool {
		info, err := outbox.Get(context.Background(), pool, "plugin-run", "k")
		return err == nil && info.State == outbox.StatePublished
	}) {
		t.Fatalf("task never published; stdout %q stderr %q", out.String(), errOut.String())
	}
	cancel()
	waitStopped(t, done)
	logs := out.String() + errOut.String()
	if n := strings.Count(logs, "archived upstream"); n != 1 || !strings.Contains(logs, "docs/brokers.md") {
		t.Fatalf("%d retirement warnings, want 1 naming docs/brokers.md:\n%s", n, logs)
	}
}
