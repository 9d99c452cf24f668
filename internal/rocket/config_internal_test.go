package rocket

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// A relay on RocketMQ runs DefaultRelayWorkers claim loops unless the
// limits name another number: the adapter fills in its advice whatever
// else the limits set, and keeps the user's.
func TestConfig_AdvisesTheRelaysWorkers(t *testing.T) {
	levels := LevelLimits(DefaultLevels(), 0)
	levels.RelayWorkers = 0
	for _, tc := range []struct {
		name   string
		limits broker.Limits
		want   int
	}{
		{"nothing set", broker.Limits{}, DefaultRelayWorkers},
		{"levels set", levels, DefaultRelayWorkers},
		{"max hop set", broker.Limits{MaxHop: time.Hour}, DefaultRelayWorkers},
		{"workers set", broker.Limits{RelayWorkers: 3}, 3},
	} {
		got, err := Config{NameServers: []string{"127.0.0.1:9876"}, Limits: tc.limits}.withDefaults()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got.Limits.RelayWorkers != tc.want {
			t.Errorf("%s: RelayWorkers %d, want %d", tc.name, got.Limits.RelayWorkers, tc.want)
		}
	}
	if DefaultRelayWorkers <= 4 {
		t.Errorf("DefaultRelayWorkers %d: want more loops than the relay's own 4, or RocketMQ's timed sends leave the publisher idle", DefaultRelayWorkers)
	}
}
