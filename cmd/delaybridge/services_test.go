package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// syncBuffer is a buffer safe to read while a command writes to it.
type syncBuffer = testenv.SyncBuffer

// rocketFlags points the CLI at the local RocketMQ with its test limits.
func rocketFlags(t *testing.T) []string {
	t.Helper()
	return []string{"--broker", "rocket", "--rocketmq-namesrv", testenv.RocketMQ(t), "--rocketmq-max-delay", "1h", "--rocketmq-precision", "100ms",
		"--rocketmq-group-prefix", testenv.Name("cli")}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestRun_RelaysTasksServesMetricsAndStopsCleanly(t *testing.T) {
	dsn := scratch(t)
	pool := openDSN(t, dsn)
	// k1 is due within RabbitMQ's default lookahead (10s), later the week
	// after: the first goes to the broker, the second waits in the table.
	if _, err := outbox.Schedule(context.Background(), pool, outbox.Task{Topic: "run-test", Key: "k1", DueAt: time.Now().Add(3 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Schedule(context.Background(), pool, outbox.Task{Topic: "run-test", Key: "later", DueAt: time.Now().Add(7 * 24 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	addr := testenv.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	root := newRootCmd()
	root.SetArgs(append([]string{"run", "--mysql-dsn", dsn, "--http", addr, "--grace", "1s", "--stats-interval", "100ms"}, testenv.RabbitFlags(t)...))
	root.SetOut(&out)
	root.SetErr(&errOut)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()

	deadline := time.Now().Add(30 * time.Second)
	if !testutil.Eventually(30*time.Second, 50*time.Millisecond, func() bool {
		info, err := outbox.Get(context.Background(), pool, "run-test", "k1")
		return err == nil && info.State == outbox.StatePublished
	}) {
		t.Fatalf("task never published; stdout %q stderr %q", out.String(), errOut.String())
	}
	if code, body := get(t, "http://"+addr+"/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, "http://"+addr+"/readyz"); code != 200 {
		t.Fatalf("/readyz: %d %q", code, body)
	}
	// The task counts come from the background count, which catches up
	// with the publish within an interval or two.
	wants := []string{"delaybridge_relay_published_total 1", `delaybridge_outbox_tasks{state="published",topic="run-test"} 1`,
		"delaybridge_outbox_up 1", "delaybridge_outbox_stats_age_seconds "}
	var metrics string
	var lacks []string
	if !testutil.Eventually(time.Until(deadline), 50*time.Millisecond, func() bool {
		_, metrics = get(t, "http://"+addr+"/metrics")
		lacks = slices.DeleteFunc(slices.Clone(wants), func(w string) bool { return strings.Contains(metrics, w) })
		return len(lacks) == 0
	}) {
		t.Fatalf("/metrics lacks %q:\n%s", lacks, metrics)
	}
	if info, err := outbox.Get(context.Background(), pool, "run-test", "later"); err != nil || info.State != outbox.StatePending {
		t.Errorf("a task due next week: %+v, %v; want it still pending, outside the default lookahead", info, err)
	}
	if strings.Contains(metrics, "delaybridge:delaybridge@") || strings.Contains(metrics, "k1") {
		t.Error("/metrics exposes a DSN or a task key")
	}
	cancel()
	waitStopped(t, done)
	if !strings.Contains(out.String(), "delaybridge stopped") {
		t.Fatalf("stdout %q", out.String())
	}
}

// waitStopped waits for a run whose context ended to return nil.
func waitStopped(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("run did not stop after its context ended")
	}
}

// lastJSON decodes the last line of out.
func lastJSON(t *testing.T, out string) map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil {
		t.Fatalf("last line is not JSON: %v\n%s", err, out)
	}
	return m
}

func TestDemo_HoldsItsInvariantsOnBothBrokers(t *testing.T) {
	for _, b := range []struct {
		name  string
		flags func(*testing.T) []string
	}{{"rabbit", func(t *testing.T) []string { return testenv.RabbitFlags(t) }}, {"rocket", rocketFlags}} {
		t.Run(b.name, func(t *testing.T) {
			_, dsn := testenv.ScratchDB(t)
			out := mustRun(t, append([]string{"demo", "--mysql-dsn", dsn, "--orders", "80", "--timeout", "2s", "--spread", "1s", "--json", "--log-level", "error"}, b.flags(t)...)...)
			m := lastJSON(t, out)
			if m["broker"] != b.name || m["orders"] != 80.0 || m["wrongly_cancelled"] != 0.0 || m["left_unpaid"] != 0.0 || m["stock_ok"] != true ||
				m["paid"].(float64)+m["cancelled"].(float64) != 80 {
				t.Fatalf("demo summary %v", m)
			}
		})
	}
}

func TestBench_HandlesEveryTaskOnBothBrokers(t *testing.T) {
	for _, b := range []struct {
		name    string
		flags   func(*testing.T) []string
		handler string
		extra   []string
	}{{"rabbit", func(t *testing.T) []string { return testenv.RabbitFlags(t) }, "db", []string{"--group", "20"}}, {"rocket", rocketFlags, "noop", nil}} {
		t.Run(b.name, func(t *testing.T) {
			_, dsn := testenv.ScratchDB(t)
			// A topic of its own: a new RocketMQ group on the shared
			// delaybridge-bench topic would start from whatever earlier
			// relay-only runs left there.
			out := mustRun(t, append([]string{"bench", "--mysql-dsn", dsn, "--topic", testenv.Name("bench"), "--tasks", "400", "--delay", "1s", "--spread", "1s", "--per-tx", "10",
				"--handler", b.handler, "--baseline", "--json", "--wait", "60s", "--log-level", "error"}, append(b.flags(t), b.extra...)...)...)
			m := lastJSON(t, out)
			if m["tasks"] != 400.0 || m["handled"] != 400.0 || m["lost"] != 0.0 || m["early"] != 0.0 || m["dup_effects"] != 0.0 {
				t.Fatalf("bench summary %v", m)
			}
			for _, k := range []string{"schedule_tps", "relay_tps", "baseline_publish_tps"} {
				if v, _ := m[k].(float64); v <= 0 {
					t.Errorf("%s = %v, want a positive rate", k, m[k])
				}
			}
			for _, k := range []string{"lateness_ms", "published_late_ms"} {
				if l, _ := m[k].(map[string]any); l == nil || l["p99"] == nil {
					t.Errorf("no %s percentiles in %v", k, m)
				}
			}
			// Each message reaches the consumer before its handler runs:
			// the broker's share is no more than the whole lateness.
			l, _ := m["lateness_ms"].(map[string]any)
			d, _ := m["delivered_late_ms"].(map[string]any)
			if l == nil || d == nil || !(d["p50"].(float64) <= d["p99"].(float64) && d["p99"].(float64) <= d["max"].(float64) && d["max"].(float64) <= l["max"].(float64)) {
				t.Errorf("delivered_late_ms %v, want ordered percentiles up to lateness_ms's max (%v)", m["delivered_late_ms"], m["lateness_ms"])
			}
			// The due window: from the first task due (about 1 s after the
			// start) to the last handled, which comes no sooner.
			first, _ := m["first_due_unix_ms"].(float64)
			last, _ := m["last_handled_unix_ms"].(float64)
			if now := float64(time.Now().UnixMilli()); first < now-10*60*1000 || last < first || last > now {
				t.Errorf("due window %v..%v, want the first due before the last handled, both within the run", m["first_due_unix_ms"], m["last_handled_unix_ms"])
			}
			checkBenchPhases(t, m)
		})
	}
	// Nothing wakes the relay after a commit: its probe finds each task.
	t.Run("no nudge", func(t *testing.T) {
		_, dsn := testenv.ScratchDB(t)
		out := mustRun(t, "bench", "--mysql-dsn", dsn, "--database-only", "--no-nudge", "--tasks", "20", "--rate", "20", "--delay", "0s",
			"--handler", "db", "--json", "--wait", "30s", "--log-level", "error")
		m := lastJSON(t, out)
		if m["handled"] != 20.0 || m["lost"] != 0.0 || m["early"] != 0.0 || m["dup_effects"] != 0.0 {
			t.Fatalf("no-nudge summary %v", m)
		}
		// Due the moment they are scheduled, the tasks reach the broker
		// after due: the relay's share of the lateness is there and not 0.
		// Every task has its publish time, also one the consumer finished
		// before the relay marked its row (the in-process broker is that
		// fast).
		p, _ := m["published_late_ms"].(map[string]any)
		if p == nil || p["tasks"] != 20.0 || !(p["p50"].(float64) <= p["p99"].(float64) && p["p99"].(float64) <= p["max"].(float64) && p["max"].(float64) > 0) {
			t.Fatalf("published_late_ms %v, want ordered percentiles of 20 tasks with a max above 0", m["published_late_ms"])
		}
		// Each was scheduled due at once, so the relay's reaction from
		// the scheduling commit is no longer than from due.
		a, _ := m["published_after_commit_ms"].(map[string]any)
		if a == nil || a["tasks"] != 20.0 || !(a["p50"].(float64) <= a["p99"].(float64) && a["p99"].(float64) <= a["max"].(float64) && a["max"].(float64) <= p["max"].(float64)) {
			t.Errorf("published_after_commit_ms %v, want ordered percentiles of 20 tasks, none above published_late_ms's max %v", m["published_after_commit_ms"], p["max"])
		}
		// A paced run times the database's commit through the run.
		c, _ := m["db_commit_ms"].(map[string]any)
		if c == nil || !(c["samples"].(float64) >= 5 && c["p50"].(float64) <= c["p99"].(float64) && c["p99"].(float64) <= c["max"].(float64)) {
			t.Errorf("db_commit_ms %v, want ordered percentiles of at least 5 samples (a run of about a second, one every 50 ms)", m["db_commit_ms"])
		}
	})
	t.Run("relay only", func(t *testing.T) {
		_, dsn := testenv.ScratchDB(t)
		out := mustRun(t, "bench", "--mysql-dsn", dsn, "--database-only", "--relay-only", "--preload", "--baseline", "--tasks", "300", "--json", "--log-level", "error")
		m := lastJSON(t, out)
		if m["scheduled"] != 300.0 {
			t.Fatalf("relay-only summary %v", m)
		}
		checkBenchPhases(t, m)
	})
}

// checkBenchPhases checks that a --baseline run's summary bounds the
// baseline and then the relay, in that order, within the last ten minutes
// (scripts/bench-relay.sh reads these bounds to share out the CPU).
func checkBenchPhases(t *testing.T, m map[string]any) {
	t.Helper()
	now := float64(time.Now().UnixMilli())
	prev := now - 10*60*1000
	for _, k := range []string{"baseline_start_unix_ms", "baseline_end_unix_ms", "relay_start_unix_ms", "relay_end_unix_ms"} {
		v, _ := m[k].(float64)
		if v < prev || v > now {
			t.Errorf("%s = %v, want a time after the one before (%v) and no later than now", k, m[k], prev)
		}
		prev = v
	}
}

func TestDoctor_PassesOnTheLocalServicesAndCatchesAWrongLimit(t *testing.T) {
	dsn := scratch(t)
	out := mustRun(t, append([]string{"doctor", "--mysql-dsn", dsn}, testenv.RabbitFlags(t)...)...)
	if !strings.Contains(out, "OK    RabbitMQ 3.") || !strings.Contains(out, "0 failed") {
		t.Fatalf("doctor rabbit:\n%s", out)
	}
	out, _, err := run(t, append([]string{"doctor", "--mysql-dsn", dsn, "--log-level", "error"}, append(rocketFlags(t), "--rocketmq-max-delay", "2h")...)...)
	if err == nil || !strings.Contains(out, "FAIL  rocket: configured limits exceed the broker's: configured max hop 2h0m0s, the broker's timerMaxDelaySec is 1h0m0s") {
		t.Fatalf("doctor with a limit above the broker's: err %v\n%s", err, out)
	}
	out = mustRun(t, append([]string{"doctor", "--mysql-dsn", dsn, "--log-level", "error"}, rocketFlags(t)...)...)
	if !strings.Contains(out, "OK    the broker refuses 1h1m0s") || !strings.Contains(out, "probe arrived") || !strings.Contains(out, "timerMaxDelaySec 1h0m0s, timerPrecisionMs 100ms") {
		t.Fatalf("doctor rocket:\n%s", out)
	}
	// An unmigrated database fails the schema check.
	_, bare := testenv.ScratchDB(t)
	if out, _, err := run(t, append([]string{"doctor", "--mysql-dsn", bare}, testenv.RabbitFlags(t)...)...); err == nil || !strings.Contains(out, "FAIL  outbox schema not migrated") {
		t.Fatalf("doctor on an empty database: %v\n%s", err, fmt.Sprint(out))
	}
	// One left behind the binary's newest migration fails it too.
	pool, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec("DELETE FROM delaybridge_migration WHERE version > 1"); err != nil {
		t.Fatal(err)
	}
	if out, _, err := run(t, append([]string{"doctor", "--mysql-dsn", dsn}, testenv.RabbitFlags(t)...)...); err == nil || !strings.Contains(out, "FAIL  outbox schema at version 1, this binary needs") {
		t.Fatalf("doctor on a version-1 schema: %v\n%s", err, out)
	}
}

func TestBench_RelayLookaheadHoldsTasksUntilTheirWindow(t *testing.T) {
	_, dsn := testenv.ScratchDB(t)
	// Due 4-5 s out with a 1 s lookahead: the relay cannot finish before the
	// first task is 1 s from due, so it takes at least 2.5 s for 200 tasks.
	out := mustRun(t, append([]string{"bench", "--mysql-dsn", dsn, "--tasks", "200", "--delay", "4s", "--spread", "1s", "--per-tx", "10",
		"--handler", "db", "--group", "20", "--lookahead", "1s", "--rabbit-prefetch", "500", "--json", "--wait", "60s", "--log-level", "error"}, testenv.RabbitFlags(t)...)...)
	m := lastJSON(t, out)
	if m["handled"] != 200.0 || m["lost"] != 0.0 || m["early"] != 0.0 || m["dup_effects"] != 0.0 {
		t.Fatalf("bench summary %v", m)
	}
	if v, _ := m["relay_tps"].(float64); v <= 0 || v > 200/2.5 {
		t.Fatalf("relay_tps = %v: the relay did not wait for the lookahead", m["relay_tps"])
	}
}

// --database-only runs the workload through the in-process broker: every
// task handled once, none early, and the group commit reported.
func TestBench_DatabaseOnlyRunsTheWorkloadWithoutTheBroker(t *testing.T) {
	_, dsn := testenv.ScratchDB(t)
	out := mustRun(t, append([]string{"bench", "--mysql-dsn", dsn, "--tasks", "300", "--delay", "2s", "--per-tx", "50", "--preload", "--anchored",
		"--handler", "db", "--database-only", "--json", "--wait", "60s", "--log-level", "error"}, testenv.RabbitFlags(t)...)...)
	m := lastJSON(t, out)
	if m["handled"] != 300.0 || m["lost"] != 0.0 || m["early"] != 0.0 || m["dup_effects"] != 0.0 {
		t.Fatalf("bench summary %v", m)
	}
	if mode, _ := m["mode"].(string); !strings.HasPrefix(mode, "database only") {
		t.Fatalf("mode %q, want the in-process broker named", mode)
	}
	if g, _ := m["groups"].(float64); g < 1 {
		t.Fatalf("groups = %v: 300 tasks due at one instant ran without a group commit", m["groups"])
	}
}

// --floor runs the workload through the in-process broker first, then
// through the broker, in one process, and reports both.
func TestBench_FloorRunsTheDatabaseAloneBeforeTheBroker(t *testing.T) {
	_, dsn := testenv.ScratchDB(t)
	out := mustRun(t, append([]string{"bench", "--mysql-dsn", dsn, "--tasks", "300", "--delay", "2s", "--per-tx", "50", "--preload", "--anchored",
		"--handler", "db", "--floor", "--json", "--wait", "60s", "--log-level", "error"}, testenv.RabbitFlags(t)...)...)
	m := lastJSON(t, out)
	if m["handled"] != 300.0 || m["lost"] != 0.0 || m["early"] != 0.0 || m["dup_effects"] != 0.0 || m["mode"] != "ladder" {
		t.Fatalf("bench summary %v", m)
	}
	f, ok := m["floor"].(map[string]any)
	if !ok {
		t.Fatalf("no floor in the summary %v", m)
	}
	if f["handled"] != 300.0 || f["lost"] != 0.0 || f["early"] != 0.0 || f["dup_effects"] != 0.0 {
		t.Fatalf("floor summary %v", f)
	}
	if mode, _ := f["mode"].(string); !strings.HasPrefix(mode, "database only") {
		t.Fatalf("floor mode %q, want the in-process broker", mode)
	}
	floorEnd, _ := f["last_handled_unix_ms"].(float64)
	relayStart, _ := m["relay_start_unix_ms"].(float64)
	if floorEnd == 0 || floorEnd > relayStart {
		t.Fatalf("floor handled its last task at %v, the broker run's relay started at %v: want the floor first", floorEnd, relayStart)
	}
	if !strings.Contains(out, "floor lateness ms: p50 ") || !strings.Contains(out, "floor, the same workload through the database alone just before: lateness ms p50 ") {
		t.Fatalf("the floor is not in the summary:\n%s", out)
	}
}

// A floor that loses tasks (here: a wait too short for 3,000 due at once)
// still measured something: the broker run follows, the summary carries
// both, and the bench fails after. The delay outlasts preloading and
// relaying the 3,000 on a slow machine, so no task comes due, and none is
// handled, before the bench starts its 1 ms wait.
func TestBench_AFailedFloorStillReportsTheBrokerRun(t *testing.T) {
	_, dsn := testenv.ScratchDB(t)
	out, _, err := run(t, append([]string{"bench", "--mysql-dsn", dsn, "--tasks", "3000", "--delay", "10s", "--per-tx", "500", "--preload", "--anchored",
		"--handler", "db", "--floor", "--json", "--wait", "1ms", "--log-level", "error"}, testenv.RabbitFlags(t)...)...)
	if err == nil || !strings.Contains(err.Error(), "floor: bench: lost ") {
		t.Fatalf("err = %v, want the floor's lost tasks reported", err)
	}
	m := lastJSON(t, out)
	f, ok := m["floor"].(map[string]any)
	if !ok || m["mode"] != "ladder" {
		t.Fatalf("want the broker run's summary with the floor in it, got %v", m)
	}
	if lost, _ := f["lost"].(float64); lost <= 0 {
		t.Fatalf("floor lost %v, want the tasks the 1ms wait left", f["lost"])
	}
}

// --trickle runs a second topic alone, then beside the main workload, and
// reports it by phase: every trickle task handled, none early.
func TestBench_TrickleIsReportedByPhase(t *testing.T) {
	_, dsn := testenv.ScratchDB(t)
	out := mustRun(t, append([]string{"bench", "--mysql-dsn", dsn, "--tasks", "2000", "--delay", "3s", "--per-tx", "500", "--anchored",
		"--handler", "db", "--trickle", "20", "--trickle-idle", "3s", "--trickle-delay", "500ms", "--json", "--wait", "60s", "--log-level", "error"},
		testenv.RabbitFlags(t)...)...)
	m := lastJSON(t, out)
	if m["handled"] != 2000.0 || m["lost"] != 0.0 || m["early"] != 0.0 {
		t.Fatalf("bench summary %v", m)
	}
	tr, ok := m["trickle"].(map[string]any)
	if !ok {
		t.Fatalf("no trickle in the summary %v", m)
	}
	phases, _ := tr["phases"].([]any)
	seen := map[string]float64{}
	for _, p := range phases {
		p := p.(map[string]any)
		if p["lost"] != 0.0 || p["early"] != 0.0 {
			t.Fatalf("trickle phase %v", p)
		}
		seen[p["phase"].(string)], _ = p["tasks"].(float64)
	}
	// 20 a second for 3 s alone, each due 0.5 s after it: about 50 due
	// in the idle phase.
	if seen["idle"] < 20 || seen["idle"]+seen["load"]+seen["drain"]+seen["after"] < 60 {
		t.Fatalf("trickle tasks by phase %v, want about 50 idle and 60 or more in all", seen)
	}
	if !strings.Contains(out, "delaybridge-bench-trickle, idle: ") || !strings.Contains(out, "order transactions, ms p50 ") {
		t.Fatalf("the trickle's lines are not in the summary:\n%s", out)
	}
}

// runContext runs the CLI with args under ctx and returns its stdout.
func runContext(ctx context.Context, args ...string) (string, error) {
	var out bytes.Buffer
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(io.Discard)
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

func TestBench_RefusesBadFlagsBeforeTouchingTheDatabase(t *testing.T) {
	db, dsn := testenv.ScratchDB(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--lookahead", "-1s"}, "--lookahead must not be negative"},
		{[]string{"--lookahead", "1s", "--relay-only"}, "--relay-only cannot wait for a lookahead"},
		{[]string{"--rabbit-prefetch", "0"}, "--rabbit-prefetch must be 1 to 65535"},
		{[]string{"--rabbit-prefetch", "65536"}, "--rabbit-prefetch must be 1 to 65535"},
		{[]string{"--broker", "kafka"}, `--broker "kafka"`},
		{[]string{"--topic", "two words"}, "--topic"},
		{[]string{"--concurrency", "-1"}, "--concurrency -1: need 0"},
		{[]string{"--relay-workers", "-2"}, "--relay-workers -2: need 0"},
		{[]string{"--floor", "--database-only"}, "--floor compares a broker run with the database alone"},
		{[]string{"--floor", "--relay-only"}, "--floor compares a broker run with the database alone"},
		// The adapters' rules, checked before anything connects.
		{[]string{"--rabbit-depth", "-1"}, "--rabbit-depth -1: want 1 to 62"},
		{[]string{"--rabbit-depth", "63"}, "--rabbit-depth 63: want 1 to 62"},
		{[]string{"--rabbit-unit", "1500us"}, "--rabbit-unit 1.5ms: want a whole number of milliseconds"},
		{[]string{"--rabbit-prefix", "a b"}, "Config.Prefix"},
		{[]string{"--amqp-url", "http://u:p@127.0.0.1:5672/"}, "not a valid AMQP URL"},
		{[]string{"--broker", "rocket", "--rocketmq-group-prefix", "a b"}, "Config.GroupPrefix"},
		{[]string{"--broker", "rocket", "--rocketmq-queues", "-4"}, "--rocketmq-queues -4"},
		{[]string{"--rate", "-5"}, "--rate -5: need 0"},
		{[]string{"--spread", "-1s"}, "none may be negative"},
		{[]string{"--wait", "-1h"}, "none may be negative"},
		{[]string{"--rate", "NaN"}, "--rate NaN: need 0"},
		{[]string{"--rate", "+Inf"}, "--rate +Inf: need 0"},
		{[]string{"--tasks", "9223372036854775807"}, "--tasks 9223372036854775807: at most"},
		{[]string{"--http", "nonsense"}, "--http nonsense"},
		{[]string{"--rabbit-prefix", ""}, `invalid argument "" for "--rabbit-prefix" flag: must not be empty`},
		{[]string{"--relay-batch", "0"}, "--relay-batch 0: need 1"},
		{[]string{"--group", "-1"}, "--group -1: need 1"},
		{[]string{"--trickle", "-1"}, "--trickle -1: need 0"},
		{[]string{"--trickle", "5", "--preload"}, "--trickle needs the relay running from the start"},
		{[]string{"--trickle", "5", "--trickle-idle", "0s"}, "need a positive idle time"},
	} {
		_, _, err := run(t, append([]string{"bench", "--mysql-dsn", dsn, "--tasks", "10", "--log-level", "error"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("bench %v: err = %v, want %q", c.args, err, c.want)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--relay-workers", "-1"}, "--relay-workers -1: need 0"},
		{[]string{"--relay-topic-rate", "order-cancel=0"}, "--relay-topic-rate order-cancel=0: want a rate above 0"},
		{[]string{"--relay-topic-rate", "order-cancel=fast"}, "--relay-topic-rate order-cancel=fast: want a rate above 0"},
		{[]string{"--relay-topic-rate", "a b=5"}, "--relay-topic-rate a b=5"},
		{[]string{"--cleaner-duty", "0"}, "--cleaner-duty 0"},
		{[]string{"--metrics-topics", "0"}, "--metrics-topics 0"},
		{[]string{"--lookahead", "-1s"}, "--lookahead must not be negative"},
		{[]string{"--lookahead", "10ms"}, "Lookahead 10ms is shorter than the relay's ProbeMax"},
		{[]string{"--batch", "0"}, "--batch 0"},
		{[]string{"--retention", "0s"}, "--retention 0s"},
		{[]string{"--grace", "-1s"}, "--grace -1s"},
		{[]string{"--publish-timeout", "0s"}, "--publish-timeout 0s"},
		{[]string{"--relay-batch-bytes", "0"}, "--relay-batch-bytes 0"},
		{[]string{"--http", "127.0.0.1:notaport"}, "notaport"},
		{[]string{"--http", ""}, "--http: empty"},
		{[]string{"--cleaner-duty", "NaN"}, "--cleaner-duty NaN"},
		{[]string{"--rabbit-prefix", ""}, "must not be empty"},
		{[]string{"--rabbit-depth", "-1"}, "--rabbit-depth -1"},
	} {
		_, _, err := run(t, append([]string{"run", "--mysql-dsn", dsn, "--amqp-url", "amqp://delaybridge:delaybridge@127.0.0.1:5672/", "--log-level", "error"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run %v: err = %v, want %q", c.args, err, c.want)
		}
	}
	// demo checks its flags, --http too, before it migrates the database.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--http", "nonsense"}, "--http nonsense"},
		{[]string{"--pay-ratio", "NaN"}, "0 <= --pay-ratio <= 1"},
		{[]string{"--spread", "-5s"}, "--spread >= 0"},
		{[]string{"--wait", "-1h"}, "--wait >= 0"},
	} {
		_, _, err := run(t, append([]string{"demo", "--mysql-dsn", dsn, "--orders", "5", "--log-level", "error"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("demo %v: err = %v, want %q", c.args, err, c.want)
		}
	}
	// A refused bench neither creates nor truncates its --cpuprofile.
	dir := t.TempDir()
	kept, fresh := filepath.Join(dir, "kept.prof"), filepath.Join(dir, "fresh.prof")
	if err := os.WriteFile(kept, []byte("an earlier profile"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, prof := range []string{kept, fresh} {
		_, _, err := run(t, "bench", "--mysql-dsn", dsn, "--tasks", "10", "--log-level", "error", "--cpuprofile", prof, "--concurrency", "-1")
		if err == nil || !strings.Contains(err.Error(), "--concurrency -1: need 0") {
			t.Errorf("bench --cpuprofile %s --concurrency -1: err = %v, want the --concurrency error", prof, err)
		}
	}
	if b, err := os.ReadFile(kept); err != nil || string(b) != "an earlier profile" {
		t.Errorf("a refused bench changed the existing --cpuprofile: %q, %v", b, err)
	}
	if _, err := os.Stat(fresh); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused bench created its --cpuprofile: %v", err)
	}
	// The commands that read the outbox or probe the broker refuse bad
	// flags before they open the database, create a topic or publish: they
	// print nothing. A console that wrongly started is stopped by the
	// context's deadline, and then returns no error.
	auth := writeAuthFile(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dead", "list", "--limit", "-1"}, "--limit -1: want 1 or more"},
		{[]string{"dead", "list", "--limit", "0"}, "--limit 0: want 1 or more"},
		{[]string{"status", "--grace", "-1s"}, "--grace -1s: want 0"},
		{[]string{"status", "--window", "-10m"}, "--window -10m0s: want 0"},
		{[]string{"console", "--auth-file", auth, "--listen", "127.0.0.1:0", "--grace", "-1s"}, "--grace -1s: want 0"},
		{[]string{"console", "--auth-file", auth, "--listen", "127.0.0.1:0", "--probe-delay", "-2s"}, "--probe-delay -2s: want a positive duration"},
		{[]string{"console", "--auth-file", auth, "--listen", "127.0.0.1:0", "--probe-delay", "0s"}, "--probe-delay 0s: want a positive duration"},
		{append([]string{"doctor", "--probe-delay", "-2s"}, rocketFlags(t)...), "--probe-delay -2s: want a positive duration"},
		{append([]string{"doctor", "--probe-delay", "0s"}, rocketFlags(t)...), "--probe-delay 0s: want a positive duration"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		out, err := runContext(ctx, append(c.args, "--mysql-dsn", dsn, "--log-level", "error")...)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.want)
		}
		if out != "" {
			t.Errorf("%v printed %q before refusing its flags", c.args, out)
		}
	}
	// An empty DSN in --shard names the shard, not --mysql-dsn (which
	// --shard replaces; emptied here so the environment's does not clash).
	if _, _, err := run(t, "status", "--mysql-dsn=", "--shard", "a="+dsn, "--shard", "b=", "--log-level", "error"); err == nil || !strings.Contains(err.Error(), "--shard b: empty DSN") {
		t.Errorf("status --shard b=: err = %v, want %q", err, "--shard b: empty DSN")
	}
	// The scratch database was never migrated by bench nor announced to by
	// run: no table was made.
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("bench, demo or run made %d tables in the scratch database while refusing their flags", n)
	}
}
