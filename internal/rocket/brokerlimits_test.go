package rocket_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestReadBrokerLimits_ReadsTheLocalBrokersSettings(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	live, err := rocket.ReadBrokerLimits(ctx, rocket.Config{NameServers: e.nameServers})
	if err != nil {
		t.Fatal(err)
	}
	// What scripts/rocketmq/broker.conf sets.
	if !live.TimerWheel || live.TimerMaxDelay != localTimerMaxDelay || live.TimerPrecision != localPrecision || !slices.Equal(live.Levels, rocket.DefaultLevels()) {
		t.Errorf("ReadBrokerLimits = %+v, want the timer wheel on, %v, %v and the default levels", live, localTimerMaxDelay, localPrecision)
	}
	if !slices.Contains(mapValues(live.Brokers), testenv.RocketBrokerAddr()) {
		t.Errorf("brokers asked %v, want %s among them", live.Brokers, testenv.RocketBrokerAddr())
	}
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func TestNewPublisher_TakesUnsetLimitsFromTheBroker(t *testing.T) {
	e := setup(t)
	for _, c := range []struct {
		name string
		set  broker.Limits
		want broker.Limits
	}{
		{"nothing set", broker.Limits{}, rocket.TimerLimits(localTimerMaxDelay, localPrecision)},
		{"max hop set", broker.Limits{MaxHop: 10 * time.Minute}, rocket.TimerLimits(10*time.Minute, localPrecision)},
		{"precision set", broker.Limits{Precision: time.Second}, rocket.TimerLimits(localTimerMaxDelay, time.Second)},
		{"broker's levels", rocket.LevelLimits(rocket.DefaultLevels(), 0), rocket.LevelLimits(rocket.DefaultLevels(), 0)},
	} {
		t.Run(c.name, func(t *testing.T) {
			pub, err := rocket.NewPublisher(context.Background(), e.config(c.set))
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			if got := pub.Limits(); got.MaxHop != c.want.MaxHop || got.Precision != c.want.Precision || !slices.Equal(got.Levels, c.want.Levels) {
				t.Errorf("Limits() = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestNewPublisher_RefusesLimitsTheBrokerCannotKeepNamingBoth(t *testing.T) {
	e := setup(t)
	for _, c := range []struct {
		name  string
		set   broker.Limits
		names []string
	}{
		{"max hop above timerMaxDelaySec", rocket.TimerLimits(72*time.Hour, localPrecision), []string{"configured max hop 72h0m0s", "timerMaxDelaySec is 1h0m0s"}},
		{"precision finer than timerPrecisionMs", rocket.TimerLimits(time.Hour, 10*time.Millisecond), []string{"configured precision 10ms", "timerPrecisionMs is 100ms"}},
		{"other levels", rocket.LevelLimits([]time.Duration{time.Second, 5 * time.Second, 3 * time.Hour}, 0), []string{`configured delay levels "1s 5s 3h"`, `messageDelayLevel is "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			pub, err := rocket.NewPublisher(context.Background(), e.config(c.set))
			if err == nil {
				_ = pub.Close()
				t.Fatalf("NewPublisher accepted %+v", c.set)
			}
			if !errors.Is(err, rocket.ErrLimitsExceedBroker) {
				t.Errorf("err = %v, want ErrLimitsExceedBroker", err)
			}
			for _, n := range c.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("err = %v, want it to name %q", err, n)
				}
			}
		})
	}
}

func TestNewPublisher_UnsetLimitsAndNoBrokerToAskIsAnError(t *testing.T) {
	_, err := rocket.NewPublisher(context.Background(), rocket.Config{NameServers: []string{"127.0.0.1:1"}, SendTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "Config.Limits unset and the broker's own cannot be read") {
		t.Errorf("NewPublisher without limits or a name server = %v", err)
	}
	// Set limits go ahead unchecked, with a warning.
	pub, err := rocket.NewPublisher(context.Background(), rocket.Config{NameServers: []string{"127.0.0.1:1"}, SendTimeout: time.Second, Limits: rocket.TimerLimits(time.Hour, time.Second)})
	if err != nil {
		t.Fatalf("NewPublisher with limits and no name server: %v", err)
	}
	_ = pub.Close()
}
