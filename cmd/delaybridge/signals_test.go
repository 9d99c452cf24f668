package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// gatherOutbox scrapes the outbox series newMetrics exports for db's DSN:
// name{labels} → value.
func gatherOutbox(t *testing.T, dsn string) map[string]float64 {
	t.Helper()
	m := newMetrics(openDSN(t, dsn), 30*time.Second, slog.New(slog.DiscardHandler))
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "delaybridge_") {
			continue
		}
		for _, s := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range s.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			got[key] = s.GetGauge().GetValue()
		}
	}
	return got
}

// presence announces a process of role with topo on dsn's outbox until the
// test ends (WarnOnly: a test may record processes that disagree).
func presence(t *testing.T, dsn, instance string, role outbox.Role, topo broker.Topology, topics ...string) {
	t.Helper()
	a, err := outbox.Announce(context.Background(), openDSN(t, dsn), outbox.Presence{Instance: instance, Role: role, Topology: topo, Topics: topics},
		outbox.PresenceConfig{WarnOnly: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
}

func rabbitPrefix(p string) broker.Topology {
	return broker.Topology{Broker: "rabbit", Settings: map[string]string{"prefix": p, "mode": "ladder"}}
}

// Issue 43, item 1: a published task 25 minutes past due whose rescue
// backoff is an hour ahead showed as 0 overdue, and the NO CONSUMER line
// went away. status, its JSON and /metrics count it.
func TestStatus_ATaskLongPastDueWithItsRescueBackedOffIsOverdue(t *testing.T) {
	dsn := scratch(t)
	pool := openDSN(t, dsn)
	now := time.Now()
	if _, err := outbox.Schedule(context.Background(), pool, outbox.Task{Topic: "forgotten", Key: "k1", DueAt: now.Add(-25 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	testenv.MustExec(t, pool, "UPDATE delay_task SET state = 'published', published_ms = ?, next_attempt_ms = ?, rescues = 4",
		now.Add(-5*time.Second).UnixMilli(), now.Add(time.Hour).UnixMilli())
	out := mustRun(t, "status", "--mysql-dsn", dsn)
	for _, want := range []string{"> 30s past due): 1 (0 pending)", "NO CONSUMER: topic forgotten has 1 overdue tasks"} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q:\n%s", want, out)
		}
	}
	var js struct {
		Overdue    int            `json:"overdue"`
		Unconsumed map[string]int `json:"unconsumed_overdue"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "status", "--json", "--mysql-dsn", dsn)), &js); err != nil || js.Overdue != 1 || js.Unconsumed["forgotten"] != 1 {
		t.Errorf("status --json: %+v, %v", js, err)
	}
	if got := gatherOutbox(t, dsn); got["delaybridge_outbox_overdue_tasks"] != 1 || got["delaybridge_outbox_unconsumed_overdue_tasks{topic=forgotten}"] != 1 {
		t.Errorf("/metrics: overdue %v, unconsumed %v; want 1 and 1", got["delaybridge_outbox_overdue_tasks"], got["delaybridge_outbox_unconsumed_overdue_tasks{topic=forgotten}"])
	}
}

// Issue 43, item 2: pending tasks past due with no relay running showed
// nowhere. status, its JSON, doctor's database checks, the console and
// /metrics say so; with a relay live they say it is behind instead.
func TestSignals_PendingPastDueAndNoLiveRelay(t *testing.T) {
	b := setupConsole(t, true)
	dsn := b.dsn
	if _, err := outbox.Schedule(context.Background(), b.db, outbox.Task{Topic: "stuck", Key: "p1", DueAt: time.Now().Add(-10 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	const noRelay = "NO RELAY: 1 pending tasks past due and no live relay"
	if out := mustRun(t, "status", "--mysql-dsn", dsn); !strings.Contains(out, noRelay) {
		t.Errorf("status does not say %q:\n%s", noRelay, out)
	}
	var js struct {
		NoRelay        bool `json:"no_live_relay"`
		OverduePending int  `json:"overdue_pending"`
		LiveRelays     int  `json:"live_relays"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "status", "--json", "--mysql-dsn", dsn)), &js); err != nil || !js.NoRelay || js.OverduePending != 1 || js.LiveRelays != 0 {
		t.Errorf("status --json: %+v, %v", js, err)
	}
	if _, page := b.Get(t, "/"); !strings.Contains(page, noRelay) {
		t.Errorf("the console's overview does not say %q", noRelay)
	}
	if got := gatherOutbox(t, dsn); got["delaybridge_outbox_overdue_pending_tasks"] != 1 || got["delaybridge_live_processes{role=relay}"] != 0 {
		t.Errorf("/metrics: overdue pending %v, live relays %v; want 1 and 0", got["delaybridge_outbox_overdue_pending_tasks"], got["delaybridge_live_processes{role=relay}"])
	}
	r := &report{a: &app{stdout: io.Discard}}
	checkProcesses(context.Background(), b.db, r)
	if !strings.Contains(checksText(r), "no live relay") {
		t.Errorf("doctor does not warn of the missing relay:\n%s", checksText(r))
	}

	presence(t, dsn, "relay-1", outbox.RoleRelay, rabbitPrefix("delaybridge"))
	out := mustRun(t, "status", "--mysql-dsn", dsn)
	if strings.Contains(out, "NO RELAY") || !strings.Contains(out, "RELAY BEHIND: 1 pending tasks past due though 1 relay(s) are live") {
		t.Errorf("with a live relay, status:\n%s", out)
	}
	if got := gatherOutbox(t, dsn); got["delaybridge_live_processes{role=relay}"] != 1 {
		t.Errorf("/metrics: live relays %v, want 1", got["delaybridge_live_processes{role=relay}"])
	}
}

// Issue 43, item 3: a relay whose prefix differs from the consumers' only
// logged a warning. status, doctor, the console and /metrics show the
// difference, naming both processes and both values.
func TestSignals_ARelayWhosePrefixDiffersFromTheConsumersShows(t *testing.T) {
	b := setupConsole(t, true)
	dsn := b.dsn
	presence(t, dsn, "relay-1", outbox.RoleRelay, rabbitPrefix("delaybridge"))
	presence(t, dsn, "shop-1", outbox.RoleConsumer, rabbitPrefix("shop"), "order-cancel")
	const want = `prefix: relay relay-1 "delaybridge"; consumer shop-1 "shop"`
	if out := mustRun(t, "status", "--mysql-dsn", dsn); !strings.Contains(out, "TOPOLOGY MISMATCH: "+want) {
		t.Errorf("status does not say %q:\n%s", want, out)
	}
	var js struct {
		Mismatches []string `json:"topology_mismatches"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "status", "--json", "--mysql-dsn", dsn)), &js); err != nil || len(js.Mismatches) != 1 || js.Mismatches[0] != want {
		t.Errorf("status --json: %+v, %v", js, err)
	}
	r := &report{a: &app{stdout: io.Discard}}
	checkProcesses(context.Background(), b.db, r)
	if r.failed != 1 || !strings.Contains(checksText(r), want) {
		t.Errorf("doctor: %d failed:\n%s", r.failed, checksText(r))
	}
	if _, page := b.Get(t, "/"); !strings.Contains(page, "TOPOLOGY MISMATCH: prefix: relay relay-1 &#34;delaybridge&#34;; consumer shop-1 &#34;shop&#34;") {
		t.Errorf("the console's overview does not show the mismatch:\n%s", page)
	}
	if got := gatherOutbox(t, dsn); got["delaybridge_topology_mismatches"] != 1 {
		t.Errorf("/metrics: topology mismatches %v, want 1", got["delaybridge_topology_mismatches"])
	}
	// A second relay like the first joins its line rather than add one.
	presence(t, dsn, "relay-2", outbox.RoleRelay, rabbitPrefix("delaybridge"))
	if got := gatherOutbox(t, dsn); got["delaybridge_topology_mismatches"] != 1 {
		t.Errorf("/metrics with a second relay: topology mismatches %v, want still 1", got["delaybridge_topology_mismatches"])
	}
	if out := mustRun(t, "status", "--mysql-dsn", dsn); !strings.Contains(out, `prefix: relay relay-1, relay-2 "delaybridge"; consumer shop-1 "shop"`) {
		t.Errorf("status with two relays:\n%s", out)
	}
}

func checksText(r *report) string {
	var b strings.Builder
	for _, c := range r.checks {
		b.WriteString(c.Level + " " + c.Text + "\n")
	}
	return b.String()
}

// status's state column is written by producers (any row inserted by
// hand): a control character in it is quoted, never sent to the terminal.
func TestStatus_QuotesAStateThatIsNotPrintable(t *testing.T) {
	dsn := scratch(t)
	pool := openDSN(t, dsn)
	if _, err := outbox.Schedule(context.Background(), pool, outbox.Task{Topic: "t", Key: "k", DueAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	testenv.MustExec(t, pool, "UPDATE delay_task SET state = ?", "\x1b[2J\rok")
	out := mustRun(t, "status", "--live", "--mysql-dsn", dsn)
	if strings.ContainsAny(out, "\x1b\r") || !strings.Contains(out, `"\x1b[2J\rok"`) {
		t.Fatalf("status printed the state raw:\n%q", out)
	}
}

// status says "in 58m53s" of a time to come, and long spans in days; JSON
// gives the counts' age in milliseconds.
func TestStatus_TimesReadAsAPersonWouldSayThem(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{250 * time.Millisecond, "250ms"},
		{42*time.Second + 300*time.Millisecond, "42s"},
		{58*time.Minute + 53*time.Second, "58m53s"},
		{5*time.Hour + 3*time.Minute + 20*time.Second, "5h3m"},
		{10 * time.Minute, "10m"},
		{59*time.Minute + 59*time.Second + 700*time.Millisecond, "1h"},
		{48 * time.Hour, "2d"},
		{3*24*time.Hour + 5*time.Hour + 10*time.Minute, "3d5h"},
		{1864*time.Hour + 8*time.Minute + 6300*time.Millisecond, "78 days"},
		{76*24*time.Hour + time.Hour, "76 days"},
	} {
		if got := cli.HumanDuration(tc.d); got != tc.want {
			t.Errorf("cli.HumanDuration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
	now := time.Now()
	if got := cli.Ago(now, now.Add(58*time.Minute+53*time.Second)); got != "in 58m53s" {
		t.Errorf("a time to come: %q, want \"in 58m53s\"", got)
	}

	dsn := scratch(t)
	pool := openDSN(t, dsn)
	if _, err := outbox.Schedule(context.Background(), pool, outbox.Task{Topic: "t", Key: "k", DueAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, "status", "--mysql-dsn", dsn)
	if strings.Contains(out, "(-") || !strings.Contains(out, "(in 59m") && !strings.Contains(out, "(in 1h)") {
		t.Errorf("status of a task due in an hour:\n%s", out)
	}
	if err := outbox.RefreshStats(context.Background(), pool, time.Second); err != nil {
		t.Fatal(err)
	}
	testenv.MustExec(t, pool, "UPDATE delay_task_stats_run SET computed_ms = computed_ms - 120000")
	var js map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "status", "--json", "--mysql-dsn", dsn)), &js); err != nil {
		t.Fatal(err)
	}
	if _, ns := js["counts_age_ns"]; ns {
		t.Errorf("status --json still says counts_age_ns")
	}
	if ms, _ := js["counts_age_ms"].(float64); ms < 120000 || ms > 180000 {
		t.Errorf("counts_age_ms = %v, want about 120000", js["counts_age_ms"])
	}
}
