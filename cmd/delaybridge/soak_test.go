package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// A short soak runs end to end: orders, payments some of which lose the
// race to their cancellation, `delaybridge run` in a process of its own,
// a line each window, the peak's timings, and every invariant 0.
func TestSoak_ARunEndToEndKeepsEveryInvariant(t *testing.T) {
	_, dsn := testenv.ScratchDB(t)
	bin := filepath.Join(t.TempDir(), "delaybridge")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Every payment falls in the last 2 s or just past the timeout, so
	// some race their cancellation.
	args := append([]string{"soak", "--mysql-dsn", dsn, "--orders-rate", "100", "--duration", "6s", "--timeout", "4s",
		"--pay-ratio", "0.6", "--pay-last", "2s", "--pay-last-share", "1", "--report-every", "3s", "--settle", "5s",
		"--json", "--log-level", "warn"}, testenv.RabbitFlags(t)...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = baseEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("soak: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var res struct {
		Orders, Paid, Cancelled int64
		Refused                 int64 `json:"payments_refused"`
		Lost                    int64
		DupEffects              int64 `json:"dup_effects"`
		Early                   int64
		PaidCancel              int64 `json:"paid_yet_cancelled"`
		UnpaidDue               int64 `json:"unpaid_past_due"`
		Peak                    *struct{ StatusMS, MetricsMS, OverviewMS float64 }
		Windows                 []json.RawMessage
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("last line is not the JSON summary: %v\n%s", err, out)
	}
	// A refused payment's order was cancelled: paid and cancelled add up.
	if res.Orders < 400 || res.Paid == 0 || res.Refused == 0 || res.Paid+res.Cancelled != res.Orders {
		t.Fatalf("orders %d, paid %d, refused %d, cancelled %d: want every order paid or cancelled, and some payments refused", res.Orders, res.Paid, res.Refused, res.Cancelled)
	}
	if res.Lost+res.DupEffects+res.Early+res.PaidCancel+res.UnpaidDue != 0 {
		t.Fatalf("invariants broken: %+v", res)
	}
	if res.Peak == nil || len(res.Windows) < 3 {
		t.Fatalf("peak %v, %d windows: want the peak's timings and a window every 3 s", res.Peak, len(res.Windows))
	}
	if !strings.Contains(stderr.String(), "order tx p99") || !strings.Contains(stderr.String(), "relay (run)") {
		t.Fatalf("no window lines with the relay's process on stderr:\n%s", stderr.String())
	}
}

func TestSoak_RefusesBadFlagsBeforeTouchingTheDatabase(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--orders-rate", "0"}, "--orders-rate 0: need a rate above 0"},
		{[]string{"--timeout", "0s"}, "must be positive"},
		{[]string{"--pay-ratio", "1.5"}, "--pay-ratio 1.5"},
		{[]string{"--pay-last", "2m"}, "--pay-last 2m0s: need 0 or more and less than --timeout"},
		{[]string{"--order-workers", "0"}, "--order-workers 0"},
	} {
		// A DSN nothing listens on: a refused flag never gets that far.
		_, _, err := run(t, append([]string{"soak", "--mysql-dsn", "u:p@tcp(127.0.0.1:1)/none"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("soak %v: err = %v, want %q", c.args, err, c.want)
		}
	}
}
