package soak

import (
	"os"
	"strconv"
	"strings"
)

// proc is a process whose CPU and memory soak reports each minute.
type proc struct {
	name string
	pid  int
}

// servers finds the local servers by their command lines, as
// scripts/bench-cpu.sh does: MariaDB, RabbitMQ, the RocketMQ broker. A
// server not running is left out.
func servers() []proc {
	var out []proc
	want := []struct{ name, match string }{
		{"mariadb", "mariadbd"},
		{"rabbitmq", "beam.smp"},
		{"rocketmq", "org.apache.rocketmq.broker.BrokerStartup"},
	}
	entries, _ := os.ReadDir("/proc")
	for _, w := range want {
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err != nil || !strings.Contains(string(cmd), w.match) {
				continue
			}
			if w.name == "rabbitmq" && !strings.Contains(string(cmd), "rabbit") {
				continue
			}
			out = append(out, proc{name: w.name, pid: pid})
			break
		}
	}
	return out
}

// usage is a process's CPU seconds so far and its resident memory in MiB;
// ok is false once the process is gone.
func usage(pid int) (cpu float64, rssMiB float64, ok bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name, in parentheses, may hold spaces: count fields
	// after its closing one. utime and stime are fields 14 and 15, rss
	// (pages) field 24.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 22 {
		return 0, 0, false
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	rss, _ := strconv.ParseFloat(f[21], 64)
	return (ut + st) / clockTicks, rss * float64(os.Getpagesize()) / (1 << 20), true
}

// clockTicks is USER_HZ, 100 on every Linux that soak runs on.
const clockTicks = 100
