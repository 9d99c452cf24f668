package testenv

// Faults a test injects into the local services that scripts/services.sh
// runs. Each waits until the service is back before it returns, so a test
// can measure its own recovery from that moment.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ModuleRoot is the directory of the repository's go.mod.
func ModuleRoot(t testing.TB) string { return moduleRoot(t) }

// ServicesUp runs `scripts/services.sh up`, which starts whatever is down
// and returns once every service answers.
func ServicesUp(t testing.TB) {
	t.Helper()
	root := moduleRoot(t)
	cmd := exec.Command(filepath.Join(root, "scripts", "services.sh"), "up")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/services.sh up: %v\n%s", err, out)
	}
}

// RabbitStopApp stops the RabbitMQ application (the Erlang node stays up)
// for down, then starts it again.
func RabbitStopApp(t testing.TB, down time.Duration) {
	t.Helper()
	Rabbitmqctl(t, "stop_app")
	time.Sleep(down)
	Rabbitmqctl(t, "start_app")
	Rabbitmqctl(t, "await_startup", "--timeout", "60")
}

// RabbitRestartNode stops the whole RabbitMQ node and starts it again
// through scripts/services.sh.
func RabbitRestartNode(t testing.TB) {
	t.Helper()
	Rabbitmqctl(t, "stop")
	waitPortClosed(t, "127.0.0.1:5672", time.Minute)
	ServicesUp(t)
}

// RabbitMemoryAlarm lowers RabbitMQ's memory high watermark so far that the
// broker raises its memory alarm and blocks every publishing connection,
// for d, then restores the default watermark (also at cleanup, should the
// test stop in between).
func RabbitMemoryAlarm(t testing.TB, d time.Duration) {
	t.Helper()
	restore := func() {
		_, _ = exec.Command(envOr("DELAYBRIDGE_RABBITMQCTL", "rabbitmqctl"), "set_vm_memory_high_watermark", "0.4").CombinedOutput()
	}
	t.Cleanup(restore)
	Rabbitmqctl(t, "set_vm_memory_high_watermark", "0.0001")
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(Rabbitmqctl(t, "status"), "Memory alarm") {
		if time.Now().After(deadline) {
			t.Fatal("RabbitMQ raised no memory alarm within 30s of lowering the watermark")
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(d)
	Rabbitmqctl(t, "set_vm_memory_high_watermark", "0.4")
}

// RocketKillBroker kills the RocketMQ broker with SIGKILL (no shutdown hook
// runs: what it had not flushed is the disk's problem now) and starts it
// again through scripts/services.sh.
func RocketKillBroker(t testing.TB) {
	t.Helper()
	RocketStopBroker(t, syscall.SIGKILL)
	ServicesUp(t)
}

// RocketStopBroker sends sig to the RocketMQ broker and waits until it is
// gone and its port closed; ServicesUp starts it again. It needs the broker
// this checkout's scripts/services.sh started (its pid file).
func RocketStopBroker(t testing.TB, sig syscall.Signal) {
	t.Helper()
	pidfile := filepath.Join(moduleRoot(t), ".services", "rocketmq", "broker.pid")
	pid := readPid(t, pidfile, "org.apache.rocketmq.broker.BrokerStartup")
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("%v to RocketMQ broker pid %d: %v", sig, pid, err)
	}
	waitGone(t, pid, time.Minute)
	waitPortClosed(t, RocketBrokerAddr(), time.Minute)
}

// RocketFreezeBroker stops the RocketMQ broker's process (SIGSTOP) for d
// and lets it go on (SIGCONT): a broker that hangs, its connections open
// and silent, as in a long GC pause or a network black hole. It returns
// after SIGCONT; a cleanup sends SIGCONT too, should the test stop early.
func RocketFreezeBroker(t testing.TB, d time.Duration) {
	t.Helper()
	pidfile := filepath.Join(moduleRoot(t), ".services", "rocketmq", "broker.pid")
	pid := readPid(t, pidfile, "org.apache.rocketmq.broker.BrokerStartup")
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP to RocketMQ broker pid %d: %v", pid, err)
	}
	time.Sleep(d)
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT to RocketMQ broker pid %d: %v", pid, err)
	}
}

// MariaDBRestart shuts MariaDB down cleanly and starts it again through
// scripts/services.sh.
func MariaDBRestart(t testing.TB) {
	t.Helper()
	if out, err := exec.Command("mariadb-admin", "-uroot", "shutdown").CombinedOutput(); err != nil {
		t.Fatalf("mariadb-admin shutdown: %v\n%s", err, out)
	}
	waitPortClosed(t, "127.0.0.1:3306", time.Minute)
	deadline := time.Now().Add(time.Minute)
	for fileExists("/run/mysqld/mysqld.pid") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	ServicesUp(t)
}

// MariaDBKill kills mariadbd with SIGKILL. mysqld_safe, which
// scripts/services.sh runs it under, starts it again, and InnoDB recovers
// from its redo log; MariaDBKill returns once it answers a ping.
func MariaDBKill(t testing.TB) {
	t.Helper()
	pid := readPid(t, "/run/mysqld/mysqld.pid", "mariadbd")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL mariadbd pid %d: %v", pid, err)
	}
	waitGone(t, pid, time.Minute)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if out, err := exec.Command("mariadb-admin", "-uroot", "--silent", "ping").CombinedOutput(); err == nil && strings.Contains(string(out), "alive") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("mariadbd did not come back within 2 minutes of SIGKILL (is mysqld_safe running?)")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func readPid(t testing.TB, pidfile, wantCmdline string) int {
	t.Helper()
	raw, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatalf("no pid file %s (start the services from this checkout with scripts/services.sh up): %v", pidfile, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 1 {
		t.Fatalf("bad pid in %s: %q", pidfile, raw)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if !strings.Contains(string(cmdline), wantCmdline) {
		t.Fatalf("pid %d from %s is not %s", pid, pidfile, wantCmdline)
	}
	return pid
}

// waitGone waits until pid has exited (or is a zombie nobody reaps).
func waitGone(t testing.TB, pid int, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Contains(string(stat), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still running after %v", pid, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitPortClosed(t testing.TB, addr string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return
		}
		_ = c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("%s still accepts connections after %v", addr, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
