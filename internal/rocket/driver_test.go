package rocket

import (
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/driver"
)

// flagSettings reads args as the daemon's flags into the defaults, on
// --broker rocket.
func flagSettings(t *testing.T, args ...string) *driver.Settings {
	t.Helper()
	s, err := driver.ParseArgs(append([]string{"--broker", "rocket"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestFromSettings_ConsumeGoroutinesFlag(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want int
		err  string
	}{
		{nil, DefaultConsumeGoroutines, ""},
		{[]string{"--rocketmq-consume-goroutines", "4096"}, 4096, ""},
		{[]string{"--rocketmq-consume-goroutines", "-1"}, 0, "want 1 to 100000"},
		{[]string{"--rocketmq-consume-goroutines", "200000"}, 0, "want 1 to 100000"},
	} {
		rc, err := fromSettings(flagSettings(t, c.args...), nil)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: err = %v, want %q", c.args, err, c.err)
			}
			continue
		}
		if err != nil || rc.ConsumeGoroutines != c.want {
			t.Errorf("%v: ConsumeGoroutines %d (err %v), want %d", c.args, rc.ConsumeGoroutines, err, c.want)
		}
	}
}

// A RocketMQ client in levels mode takes a list with day levels.
func TestFromSettings_LevelsModeTakesDays(t *testing.T) {
	t.Parallel()
	cfg, err := fromSettings(flagSettings(t, "--rocketmq-mode", "levels", "--rocketmq-levels", "1s 1m 1h 1d"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if lv := cfg.Limits.Levels; len(lv) != 4 || lv[3] != 24*time.Hour {
		t.Fatalf("levels = %v, want four ending in 24h", lv)
	}
}

// The topic settings reach the adapter: a Client on it creates its topics
// only when asked, on the broker named.
func TestFromSettings_TopicCreation(t *testing.T) {
	t.Parallel()
	cfg, err := fromSettings(flagSettings(t, "--rocketmq-create-topics", "--rocketmq-broker-addr", "b:1", "--rocketmq-queues", "3"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.CreateTopics || cfg.BrokerAddr != "b:1" || cfg.Queues != 3 {
		t.Errorf("topic settings = %v %q %d", cfg.CreateTopics, cfg.BrokerAddr, cfg.Queues)
	}
	if cfg, _ := fromSettings(flagSettings(t), nil); cfg.CreateTopics || cfg.Queues != defaultQueues {
		t.Errorf("defaults: create %v, queues %d", cfg.CreateTopics, cfg.Queues)
	}
}
