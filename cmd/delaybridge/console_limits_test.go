package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
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
		var bf brokerFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		bf.register(fs)
		if err := fs.Parse(append([]string{"--broker", "rabbit", "--amqp-url", "amqp://u:p@127.0.0.1:1/"}, c.args...)); err != nil {
			t.Fatal(err)
		}
		a := &app{stdout: io.Discard, stderr: io.Discard, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		lim, rows, err := consoleLimits(a, &bf)
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
