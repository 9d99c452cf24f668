package console

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// The brokers page and the planned hops use the limits the flags put in
// effect, a --rabbit-lead included, as the adapter computes them.
func TestConsoleLimits_FollowTheRabbitLeadFlag(t *testing.T) {
	for _, c := range []struct {
		args      []string
		precision time.Duration
		row       string
	}{
		{nil, 10100 * time.Millisecond, "10.1s (unit + 10s release lead"},
		{[]string{"--rabbit-lead", "2s"}, 2100 * time.Millisecond, "2.1s (unit + 2s release lead"},
		{[]string{"--rabbit-depth", "4"}, 850 * time.Millisecond, "850ms (unit + 750ms release lead"},
		// 0 means the default unit, as in the adapter.
		{[]string{"--rabbit-unit", "0"}, 10100 * time.Millisecond, "10.1s (unit + 10s release lead"},
	} {
		env := testEnv(t, "", io.Discard, append([]string{"--broker", "rabbit", "--amqp-url", "amqp://u:p@127.0.0.1:1/"}, c.args...)...)
		lim, rows, err := brokerLimits(env.Broker)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if lim.Precision != c.precision {
			t.Errorf("%v: precision %v, want %v", c.args, lim.Precision, c.precision)
		}
		var got string
		for _, r := range rows {
			if strings.Contains(strings.ToLower(r.Name), "precision") {
				got = r.Value
			}
		}
		if !strings.HasPrefix(got, c.row) {
			t.Errorf("%v: precision row %q, want it to start with %q", c.args, got, c.row)
		}
	}
}

// A task page plans the hops the RocketMQ publisher sends: with the timer
// wheel the last hop ends a precision and the lead short of the due time,
// and the consumer holds the message for the rest. The brokers page names
// the lead.
func TestPlannedHops_RocketTimerLastHopIsAPrecisionAndTheLeadShort(t *testing.T) {
	for _, c := range []struct {
		lead string
		want []string
		row  string
	}{
		{"0s", []string{"hop 1: held by the broker for 1h0m0s", "hop 2: held by the broker for 29m49s", "then held by the consumer until due, up to 11s"}, "1s + 10s lead"},
		{"-1s", []string{"hop 1: held by the broker for 1h0m0s", "hop 2: held by the broker for 29m59s", "then held by the consumer until due, up to 1s"}, "1s"},
	} {
		env := testEnv(t, "", io.Discard, "--broker", "rocket", "--rocketmq-namesrv", "127.0.0.1:1", "--rocketmq-max-delay", "1h", "--rocketmq-precision", "1s", "--rocketmq-lead", c.lead)
		now := time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)
		cs := &console{env: env, now: func() time.Time { return now }}
		d := &ops.Detail{}
		d.State = outbox.StatePending
		d.Task.DueAt = now.Add(90 * time.Minute)
		var got []string
		for _, e := range cs.plannedHops(d) {
			got = append(got, e.What)
		}
		if strings.Join(got, " | ") != strings.Join(c.want, " | ") {
			t.Errorf("lead %s: planned hops %q, want %q", c.lead, got, c.want)
		}
		_, rows, err := brokerLimits(env.Broker)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Name == "precision" && (r.Value != c.row && !strings.HasPrefix(r.Value, c.row+" (")) {
				t.Errorf("lead %s: precision row %q, want %q", c.lead, r.Value, c.row)
			}
		}
	}
}
