package rocket_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/rocket"
)

// restartBroker stops the local RocketMQ broker that scripts/services.sh
// started (SIGTERM to the pid in .services/rocketmq/broker.pid, so its
// shutdown hooks flush the store), waits until it is gone, and runs
// `scripts/services.sh up`, which starts only what is down and returns once
// the broker is registered with the name server again.
func restartBroker(t *testing.T, whileDown func()) {
	t.Helper()
	root := moduleRoot(t)
	pidfile := filepath.Join(root, ".services", "rocketmq", "broker.pid")
	raw, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatalf("restart: no broker pid file in this checkout (a broker started from another checkout keeps its store there; run scripts/services.sh down, then up, here): %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 1 {
		t.Fatalf("restart: bad pid in %s: %q", pidfile, raw)
	}
	if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); !strings.Contains(string(cmdline), "org.apache.rocketmq.broker.BrokerStartup") {
		t.Fatalf("restart: pid %d from %s is not the RocketMQ broker", pid, pidfile)
	}
	stopStart := time.Now()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("restart: SIGTERM broker pid %d: %v", pid, err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for processAlive(pid) || portOpen(brokerAddr()) {
		if time.Now().After(deadline) {
			t.Fatalf("restart: broker pid %d still running 60s after SIGTERM", pid)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("restart: broker pid %d stopped %v after SIGTERM", pid, time.Since(stopStart).Round(time.Millisecond))
	whileDown()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	upStart := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "services.sh"), "up")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("restart: scripts/services.sh up: %v\n%s", err, out)
	}
	if !portOpen(brokerAddr()) {
		t.Fatalf("restart: scripts/services.sh up returned but the broker is not listening\n%s", out)
	}
	t.Logf("restart: broker back up (services.sh up took %v)", time.Since(upStart).Round(time.Millisecond))
}

// processAlive reports whether pid runs and is not a zombie waiting for a
// parent that will never reap it.
func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

func portOpen(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

func TestBrokerRestart_PendingTimerMessagesAllArriveNoneEarly(t *testing.T) {
	testenv.SkipIfShort(t, "restarts the shared local broker")
	e := setup(t)
	topic := brokertest.Topic(t)
	pub, sub := e.clients(t, topic, rocket.TimerLimits(localTimerMaxDelay, localPrecision))

	var mu sync.Mutex
	handled := map[string]time.Time{}
	h := func(ctx context.Context, m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := handled[m.Key]; !ok {
			handled[m.Key] = time.Now()
		}
		return nil
	}
	c, err := broker.NewConsumer(sub, pub, h, broker.ConsumerConfig{Concurrency: 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })

	// Due between 3s and 60s from now: some before the broker stops, some
	// while it is down or restarting, the rest after it is back.
	const n = 300
	now := time.Now()
	msgs := make([]*broker.Message, n)
	for i := range msgs {
		d := 3*time.Second + time.Duration(i)*57*time.Second/n
		msgs[i] = &broker.Message{Topic: topic, Key: fmt.Sprintf("r-%d", i), Payload: []byte("p"), DeliverAt: broker.MillisUTC(now.Add(d))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, msgs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}

	pendingAtStop := 0
	restartBroker(t, func() {
		mu.Lock()
		pendingAtStop = n - len(handled)
		mu.Unlock()
	})
	if pendingAtStop == 0 {
		t.Fatal("every message was handled before the broker stopped; the test proves nothing")
	}
	t.Logf("%d of %d timer messages were pending when the broker stopped", pendingAtStop, n)

	deadline := time.Now().Add(120 * time.Second)
	for {
		mu.Lock()
		got := len(handled)
		mu.Unlock()
		if got == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages never arrived after the restart", n-got, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range msgs {
		if at := handled[m.Key]; at.Before(m.DeliverAt) {
			t.Errorf("%s handled %v early", m.Key, m.DeliverAt.Sub(at))
		}
	}
}
