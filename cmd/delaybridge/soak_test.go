package main

import (
	"context"
	"database/sql"
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
	// Every payment falls in the last 2 s or just past the timeout, so
	// some race their cancellation. 3,000 tasks wait beside the soak's.
	out, stderr, db := runSoak(t, "--orders-rate", "100", "--duration", "6s", "--timeout", "4s",
		"--pay-ratio", "0.6", "--pay-last", "2s", "--pay-last-share", "1", "--report-every", "3s", "--settle", "5s",
		"--waiting", "3000")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var res struct {
		Orders, Paid, Cancelled int64
		Refused                 int64 `json:"payments_refused"`
		Lost                    int64
		DupEffects              int64 `json:"dup_effects"`
		Early                   int64
		PaidCancel              int64 `json:"paid_yet_cancelled"`
		UnpaidDue               int64 `json:"unpaid_past_due"`
		Peak                    *struct {
			Waiting                         int64 `json:"waiting_tasks"`
			StatusMS, MetricsMS, OverviewMS float64
		}
		Windows []struct {
			Order  struct{ Count int } `json:"order_tx_us"`
			Plain  struct{ Count int } `json:"order_tx_without_schedule_us"`
			Row    struct{ Count int } `json:"order_tx_with_a_bare_row_us"`
			Pay    struct{ Count int } `json:"payment_tx_us"`
			PayRow struct{ Count int } `json:"payment_tx_with_a_bare_row_us"`
		}
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
	// One order in twenty also ran the yardsticks: without Schedule and
	// Cancel, and with a bare row of its own in their place.
	var orders, plain, row, pays, payRows int
	for _, w := range res.Windows {
		orders, plain, row, pays, payRows = orders+w.Order.Count, plain+w.Plain.Count, row+w.Row.Count, pays+w.Pay.Count, payRows+w.PayRow.Count
	}
	if plain < orders/25 || row < orders/25 || payRows == 0 || payRows > pays {
		t.Errorf("%d orders, %d plain and %d bare-row yardsticks; %d payments, %d bare-row: want one order in 20 timed both ways", orders, plain, row, pays, payRows)
	}
	// The loaded tasks counted as waiting at the peak, and soak deleted
	// them when it ended.
	if res.Peak.Waiting < 3000 {
		t.Errorf("peak waiting %d: want the 3,000 loaded ones counted", res.Peak.Waiting)
	}
	var left int
	if err := db.QueryRow("SELECT COUNT(*) FROM delay_task WHERE topic = 'soak-waiting'").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 || !strings.Contains(stderr, "loaded 3000 waiting tasks") {
		t.Errorf("%d waiting tasks left after the soak (want 0), stderr:\n%s", left, stderr)
	}
	if !strings.Contains(stderr, "order tx p99") || !strings.Contains(stderr, "relay (run)") {
		t.Fatalf("no window lines with the relay's process on stderr:\n%s", stderr)
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
		{[]string{"--waiting", "-1"}, "--waiting -1: need 0 or more"},
		{[]string{"--outage-at", "10s", "--outage-for", "5s", "--outage-stop", "true"}, "--outage-at needs --outage-for, --outage-stop and --outage-start"},
		{[]string{"--outage-at", "10m", "--outage-for", "5s", "--outage-stop", "true", "--outage-start", "true"}, "--outage-at 10m0s: need it before the last task is due"},
	} {
		// A DSN nothing listens on: a refused flag never gets that far.
		_, _, err := run(t, append([]string{"soak", "--mysql-dsn", "u:p@tcp(127.0.0.1:1)/none"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("soak %v: err = %v, want %q", c.args, err, c.want)
		}
	}
}

// An outage (here the relay's, stopped and continued) leaves tasks
// overdue; soak counts them when the outage ends and times their drain,
// and every invariant still holds.
func TestSoak_AnOutageIsMeasuredAndItsBacklogDrains(t *testing.T) {
	// Orders for 9 s, due 2 s later; the relay stopped from 4 s to 12 s:
	// the tasks due from 6 s on wait for it. The last is due at 11 s, and
	// the settle ends at 12 s, with the outage: soak must wait for the
	// drain before it checks the orders, or it finds them lost.
	out, stderr, _ := runSoak(t, "--orders-rate", "100", "--duration", "9s", "--timeout", "2s",
		"--pay-ratio", "0.2", "--pay-last", "1s", "--report-every", "3s", "--settle", "1s",
		"--outage-at", "4s", "--outage-for", "8s", "--outage-stop", "kill -STOP $SOAK_RUN_PID", "--outage-start", "kill -CONT $SOAK_RUN_PID")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var res struct {
		Lost, Early int64
		DupEffects  int64 `json:"dup_effects"`
		PaidCancel  int64 `json:"paid_yet_cancelled"`
		Outage      *struct {
			DownS     float64 `json:"down_s"`
			Before    int64   `json:"overdue_before"`
			Backlog   int64   `json:"overdue_at_start"`
			DrainedS  float64 `json:"drained_after_s"`
			DrainRate float64 `json:"drain_tasks_per_s"`
			Err       string  `json:"error"`
		}
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("last line is not the JSON summary: %v\n%s", err, out)
	}
	o := res.Outage
	if o == nil || o.Err != "" {
		t.Fatalf("outage %+v: want one measured without error\nstderr: %s", o, stderr)
	}
	// About 500 due while the relay was stopped, less those paid.
	if o.DownS < 7.5 || o.Backlog < o.Before+50 || o.DrainedS <= 0 || o.DrainRate <= 0 {
		t.Errorf("outage %+v: want 8 s down, 50 or more tasks overdue when it ended, and their drain timed", o)
	}
	if res.Lost+res.DupEffects+res.Early+res.PaidCancel != 0 {
		t.Errorf("invariants broken across the outage: %+v", res)
	}
	if !strings.Contains(out, "outage: broker down") {
		t.Errorf("no outage line in the summary:\n%s", out)
	}
}

// runSoak builds delaybridge and runs soak on a scratch database and the
// local RabbitMQ with args, --json and warnings only; it returns stdout,
// stderr and the database, and fails the test when soak fails.
func runSoak(t *testing.T, args ...string) (stdout, stderr string, db *sql.DB) {
	t.Helper()
	db, dsn := testenv.ScratchDB(t)
	bin := filepath.Join(t.TempDir(), "delaybridge")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args = append(append([]string{"soak", "--mysql-dsn", dsn}, args...), "--json", "--log-level", "warn")
	cmd := exec.CommandContext(ctx, bin, append(args, testenv.RabbitFlags(t)...)...)
	cmd.Env = baseEnv()
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("soak: %v\nstdout: %s\nstderr: %s", err, out, errb.String())
	}
	return string(out), errb.String(), db
}
