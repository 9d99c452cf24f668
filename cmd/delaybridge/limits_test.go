package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// run takes the limits it does not set from the live broker (the local one
// runs timerMaxDelaySec 3600 and timerPrecisionMs 100, not the 72h and 1s
// of RocketMQ's defaults) and refuses one above the broker's, naming both.
func TestRun_ReadsRocketMQLimitsFromTheBroker(t *testing.T) {
	dsn := scratch(t)
	ns := testenv.RocketMQ(t)
	base := []string{"run", "--mysql-dsn", dsn, "--broker", "rocket", "--rocketmq-namesrv", ns, "--rocketmq-group-prefix", testenv.Name("lim"),
		"--log-level", "info", "--no-scanner", "--no-cleaner", "--stats-interval", "0"}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	root := newRootCmd()
	root.SetArgs(append(base, "--http", testenv.FreeAddr(t)))
	root.SetOut(&out)
	root.SetErr(&errOut)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	if !testutil.Eventually(30*time.Second, 50*time.Millisecond, func() bool {
		select {
		case err := <-done:
			t.Fatalf("run ended before it started: %v\n%s", err, errOut.String())
		default:
		}
		return strings.Contains(errOut.String(), "delaybridge run: started")
	}) {
		t.Fatalf("run did not start:\n%s\n%s", out.String(), errOut.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The precision logged is the broker's 100 ms plus the default 10 s
	// lead, which the consumers hold.
	if log := errOut.String(); !strings.Contains(log, "limits_max_hop=1h0m0s") || !strings.Contains(log, "limits_precision=10.1s") {
		t.Errorf("run did not take the broker's 1h / 100ms (10.1s with the lead):\n%s", log)
	}

	_, _, err := run(t, append(base, "--http", testenv.FreeAddr(t), "--rocketmq-max-delay", "72h")...)
	if err == nil || !strings.Contains(err.Error(), "configured max hop 72h0m0s, the broker's timerMaxDelaySec is 1h0m0s") {
		t.Errorf("run with --rocketmq-max-delay 72h on a 1h broker: %v", err)
	}
}
