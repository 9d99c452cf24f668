package rocket

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// brokerProps is the configuration a broker answers GET_BROKER_CONFIG
// with: a 5.x broker with its timer wheel on, or, with maxDelaySec 0, a
// broker whose timer wheel is off.
func brokerProps(maxDelaySec, precisionMs int, levels string) string {
	var b strings.Builder
	if maxDelaySec > 0 {
		fmt.Fprintf(&b, "timerWheelEnable=true\ntimerMaxDelaySec=%d\ntimerPrecisionMs=%d\n", maxDelaySec, precisionMs)
	} else {
		b.WriteString("timerWheelEnable=false\n")
	}
	fmt.Fprintf(&b, "messageDelayLevel=%s\n", levels)
	return b.String()
}

// readTwoBrokers lists broker-a and broker-b under one fake name server,
// each answering with its own configuration, and reads their combined
// limits. ReadBrokerLimits visits the brokers in name order, so broker-a's
// settings are the ones it reads first.
func readTwoBrokers(t *testing.T, a, b string) (BrokerLimits, error) {
	t.Helper()
	// fakeNameServer answers any request with its body, so it serves as a
	// broker answering GET_BROKER_CONFIG as well.
	addrA, addrB := fakeNameServer(t, a), fakeNameServer(t, b)
	ns := fakeNameServer(t, `{"brokerAddrTable":{`+
		`"broker-a":{"brokerAddrs":{0:"`+addrA+`"},"brokerName":"broker-a"},`+
		`"broker-b":{"brokerAddrs":{0:"`+addrB+`"},"brokerName":"broker-b"}}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return ReadBrokerLimits(ctx, Config{NameServers: []string{ns}, SendTimeout: 20 * time.Second})
}

// timerCase is the maximum hop and precision a case configures;
// zero means the broker's.
type timerCase struct {
	maxHop, precision time.Duration
}

// Where broker groups differ, the combined limits must be what every one
// of them keeps: a publisher that took one broker's larger timer delay,
// finer precision or timer wheel would send another broker messages it
// delivers early or at once. Each case runs with the weaker broker read
// first and then last, so neither "the first broker wins" nor "the last
// broker wins" passes.
func TestReadBrokerLimits_BrokersThatDifferCombineToWhatEveryOneKeeps(t *testing.T) {
	levels := "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
	cases := []struct {
		name          string
		weak, strong  string
		wheel         bool
		maxDelay      time.Duration
		precision     time.Duration
		refused, kept timerCase
	}{
		{
			name:      "the smallest timerMaxDelaySec",
			weak:      brokerProps(3600, 1000, levels),
			strong:    brokerProps(7200, 1000, levels),
			wheel:     true,
			maxDelay:  time.Hour,
			precision: time.Second,
			refused:   timerCase{maxHop: 2 * time.Hour},
			kept:      timerCase{maxHop: time.Hour},
		},
		{
			name:      "the coarsest timerPrecisionMs",
			weak:      brokerProps(7200, 5000, levels),
			strong:    brokerProps(7200, 1000, levels),
			wheel:     true,
			maxDelay:  2 * time.Hour,
			precision: 5 * time.Second,
			refused:   timerCase{precision: time.Second},
			kept:      timerCase{precision: 5 * time.Second},
		},
		{
			name:    "the timer wheel only when every broker has it on",
			weak:    brokerProps(0, 0, levels),
			strong:  brokerProps(7200, 1000, levels),
			wheel:   false,
			refused: timerCase{maxHop: time.Hour, precision: time.Second},
		},
	}
	for _, tc := range cases {
		for _, order := range []string{"weaker first", "weaker last"} {
			t.Run(tc.name+"/"+order, func(t *testing.T) {
				a, b := tc.weak, tc.strong
				if order == "weaker last" {
					a, b = b, a
				}
				live, err := readTwoBrokers(t, a, b)
				if err != nil {
					t.Fatal(err)
				}
				if len(live.Brokers) != 2 || len(live.Unanswered) != 0 {
					t.Fatalf("answered %v, unanswered %v; want both brokers answering", live.Brokers, live.Unanswered)
				}
				if live.TimerWheel != tc.wheel || !slices.Equal(live.Levels, DefaultLevels()) {
					t.Errorf("combined timer wheel %v and levels %v; want %v and the default levels", live.TimerWheel, formatLevels(live.Levels), tc.wheel)
				}
				if tc.wheel && (live.TimerMaxDelay != tc.maxDelay || live.TimerPrecision != tc.precision) {
					t.Errorf("combined timer max delay %v, precision %v; want %v, %v", live.TimerMaxDelay, live.TimerPrecision, tc.maxDelay, tc.precision)
				}
				if l, err := live.Resolve(TimerLimits(tc.refused.maxHop, tc.refused.precision)); !errors.Is(err, ErrLimitsExceedBroker) {
					t.Errorf("Resolve(TimerLimits(%v, %v)) = %+v, %v; want ErrLimitsExceedBroker", tc.refused.maxHop, tc.refused.precision, l, err)
				}
				if !tc.wheel {
					// With no timer wheel everywhere, the default is the
					// delay levels all brokers share.
					if l := live.Limits(); !slices.Equal(l.Levels, DefaultLevels()) {
						t.Errorf("Limits() = %+v; want the delay levels", l)
					}
					return
				}
				if l, err := live.Resolve(TimerLimits(tc.kept.maxHop, tc.kept.precision)); err != nil || l.MaxHop != tc.maxDelay || l.Precision != tc.precision {
					t.Errorf("Resolve(TimerLimits(%v, %v)) = %+v, %v; want max hop %v, precision %v", tc.kept.maxHop, tc.kept.precision, l, err, tc.maxDelay, tc.precision)
				}
			})
		}
	}
}

// Brokers with different delay levels have no list every one of them
// keeps: a level index means another delay on each, so reading their
// limits must fail whichever broker is read first.
func TestReadBrokerLimits_BrokersWithDifferentDelayLevelsAreAnError(t *testing.T) {
	for _, pair := range [][2]string{{"1s 5s 10s", "1s 5s 10s 30s"}, {"1s 5s 10s 30s", "1s 5s 10s"}} {
		live, err := readTwoBrokers(t, brokerProps(7200, 1000, pair[0]), brokerProps(7200, 1000, pair[1]))
		if err == nil || !strings.Contains(err.Error(), "messageDelayLevel") {
			t.Errorf("broker-a with levels %q, broker-b with %q: %+v, %v; want an error naming messageDelayLevel", pair[0], pair[1], live, err)
		}
	}
}
