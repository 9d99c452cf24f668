package rocket

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
)

func TestSetHop_LevelModeNeverAsksForALevelAboveTheLast(t *testing.T) {
	for _, l := range []broker.Limits{
		LevelLimits(DefaultLevels(), 0),
		LevelLimits(DefaultLevels(), 5*time.Second),
		LevelLimits([]time.Duration{time.Second, 10 * time.Second}, 0),
	} {
		now := time.Unix(1_700_000_000, 0)
		for _, r := range []time.Duration{0, 999 * time.Millisecond, time.Second, 7 * time.Second, time.Hour, 3 * time.Hour, 400 * 24 * time.Hour} {
			props := map[string]string{}
			setHop(props, l.Plan(now, now.Add(r)))
			if _, ok := props[propTimerDelayMS]; ok {
				t.Fatalf("level mode set %s", propTimerDelayMS)
			}
			v, ok := props[propDelayLevel]
			if !ok {
				continue
			}
			lv, err := strconv.Atoi(v)
			if err != nil || lv < 1 || lv > len(l.Levels) || (l.MaxHop > 0 && l.Levels[lv-1] > l.MaxHop) {
				t.Errorf("levels %v MaxHop %v, remainder %v: DELAY=%q", l.Levels, l.MaxHop, r, v)
			}
		}
	}
}

func TestSetHop_TimerModeSetsOnlyARelativeDelayWithinMaxHop(t *testing.T) {
	l := TimerLimits(time.Hour, 100*time.Millisecond)
	now := time.Unix(1_700_000_000, 0)
	for r, want := range map[time.Duration]string{
		-time.Second:            "",
		0:                       "",
		50 * time.Millisecond:   "", // within the precision: sent as is, held by the consumer
		1500 * time.Millisecond: "1400",
		time.Hour:               "3599900",
		// Just past MaxHop: one last hop a precision short, not a whole
		// MaxHop that would land in the slot after the due time.
		time.Hour + 50*time.Millisecond: "3599950",
		50 * time.Hour:                  "3600000",
	} {
		props := map[string]string{}
		setHop(props, PlanHop(l, now, now.Add(r)))
		if got := props[propTimerDelayMS]; got != want {
			t.Errorf("remainder %v: %s=%q, want %q", r, propTimerDelayMS, got, want)
		}
		for k := range props {
			if k != propTimerDelayMS {
				t.Errorf("remainder %v: unexpected property %s", r, k)
			}
		}
	}
}

func TestClassify_Code13NamesTheBrokerLimit(t *testing.T) {
	raw := errors.New("CODE: 13, DESC: timer message illegal, the delay time should not be bigger than the max delay 259200000ms; or if set del msg, the delay time should be bigger than the current time")
	err := classify(raw, 4*24*time.Hour, 4*24*time.Hour)
	var re *RejectedError
	if !errors.As(err, &re) || !errors.Is(err, broker.ErrRejected) || !errors.Is(err, raw) {
		t.Fatalf("classify = %v, want a *RejectedError matching ErrRejected and the cause", err)
	}
	if re.BrokerMaxDelay != 72*time.Hour {
		t.Errorf("BrokerMaxDelay = %v, want 72h", re.BrokerMaxDelay)
	}
	if other := classify(errors.New("CODE: 1, DESC: system busy"), 0, 0); errors.Is(other, broker.ErrRejected) {
		t.Errorf("a transient error was classified as rejected: %v", other)
	}
	if plain := classify(errors.New("CODE: 13, DESC: message body size exceeds"), 0, time.Hour); !errors.Is(plain, broker.ErrRejected) {
		t.Errorf("code 13 without a timer was not rejected: %v", plain)
	}
}

func TestValidate_RejectsPropertySeparators(t *testing.T) {
	base := func() *broker.Message {
		return &broker.Message{Topic: "t", Key: "k", DeliverAt: time.Now()}
	}
	for name, m := range map[string]*broker.Message{
		"key":          func() *broker.Message { m := base(); m.Key = "a\x01b"; return m }(),
		"header name":  func() *broker.Message { m := base(); m.Headers = map[string]string{"a\x02": "v"}; return m }(),
		"header value": func() *broker.Message { m := base(); m.Headers = map[string]string{"a": "v\x01"}; return m }(),
		"trace":        func() *broker.Message { m := base(); m.Trace = "\x02"; return m }(),
	} {
		if err := validate(m); !errors.Is(err, broker.ErrRejected) {
			t.Errorf("%s with a separator: validate = %v, want ErrRejected", name, err)
		}
	}
	if err := validate(base()); err != nil {
		t.Errorf("a plain message: %v", err)
	}
}
