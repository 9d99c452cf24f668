package rocket

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// ErrLimitsExceedBroker reports configured limits the live brokers cannot
// keep: a timer hop above their timerMaxDelaySec, a precision finer than
// their timerPrecisionMs, timer mode on brokers whose timer wheel is off,
// or delay levels other than their messageDelayLevel.
var ErrLimitsExceedBroker = errors.New("rocket: configured limits exceed the broker's")

// BrokerLimits are the delay settings of the brokers under the name
// servers, as ReadBrokerLimits read them. Where the brokers differ they hold
// what every broker can keep: the smallest maximum delay, the coarsest
// precision; TimerWheel is true only when every broker has it on.
type BrokerLimits struct {
	// Brokers are the masters that answered, broker name → address.
	Brokers map[string]string
	// Unanswered are the masters the name servers list that did not
	// answer (a broker down for the moment), broker name → why. Their
	// settings are assumed to be those of the others.
	Unanswered map[string]error
	// TimerWheel is timerWheelEnable: RocketMQ 5 timer messages work.
	TimerWheel bool
	// TimerMaxDelay is timerMaxDelaySec, the longest timer delay.
	TimerMaxDelay time.Duration
	// TimerPrecision is timerPrecisionMs, the timer wheel's slot.
	TimerPrecision time.Duration
	// Levels is messageDelayLevel, the 4.x delay levels.
	Levels []time.Duration
}

// Limits returns the limits a publisher uses on these brokers when it was
// given none: timer mode when the timer wheel is on, delay levels when not.
func (b BrokerLimits) Limits() broker.Limits {
	if b.TimerWheel {
		return TimerLimits(b.TimerMaxDelay, b.TimerPrecision)
	}
	return LevelLimits(b.Levels, 0)
}

// Resolve returns l with its unset timer fields taken from the brokers, or
// an error matching ErrLimitsExceedBroker that names the configured value
// and the broker's when l asks more than the brokers keep. Zero l means
// b.Limits(); in timer mode (no Levels) a zero MaxHop or Precision means
// the broker's; with Levels, they must equal the broker's list.
func (b BrokerLimits) Resolve(l broker.Limits) (broker.Limits, error) {
	if l.MaxHop == 0 && l.Precision == 0 && len(l.Levels) == 0 {
		// Only the delay fields come from the brokers; any other field of
		// l (advice for the relay, say) stays as the caller set it.
		live := b.Limits()
		l.MaxHop, l.Precision, l.Levels = live.MaxHop, live.Precision, live.Levels
		return l, nil
	}
	if len(l.Levels) > 0 {
		if !slices.Equal(l.Levels, b.Levels) {
			return l, fmt.Errorf("%w: configured delay levels %s, the broker's messageDelayLevel is %s; configure the broker's list",
				ErrLimitsExceedBroker, formatLevels(l.Levels), formatLevels(b.Levels))
		}
		return l, nil
	}
	if !b.TimerWheel {
		return l, fmt.Errorf("%w: timer mode configured, but the broker runs with timerWheelEnable=false, so a timer message would be delivered at once; use delay levels (%s) or turn the timer wheel on",
			ErrLimitsExceedBroker, formatLevels(b.Levels))
	}
	if l.MaxHop == 0 {
		l.MaxHop = b.TimerMaxDelay
	}
	if l.Precision == 0 {
		l.Precision = b.TimerPrecision
	}
	if l.MaxHop > b.TimerMaxDelay {
		return l, fmt.Errorf("%w: configured max hop %v, the broker's timerMaxDelaySec is %v; lower it to at most the broker's (or leave it unset to use the broker's)",
			ErrLimitsExceedBroker, l.MaxHop, b.TimerMaxDelay)
	}
	if l.Precision < b.TimerPrecision {
		return l, fmt.Errorf("%w: configured precision %v, the broker's timerPrecisionMs is %v; the publisher's last hop asks a precision before due and the consumer holds what arrives up to twice that early, so a finer one makes messages late or hop again; set it to at least the broker's (or leave it unset)",
			ErrLimitsExceedBroker, l.Precision, b.TimerPrecision)
	}
	return l, nil
}

// ReadBrokerLimits asks the name servers of c for every broker group and
// each group's master for its timer and delay-level settings, through the
// remoting protocol's admin requests (GET_BROKER_CLUSTER_INFO and
// GET_BROKER_CONFIG). Each request is bounded by c.SendTimeout. A master
// that does not answer is listed in Unanswered; it is an error only when
// none answers.
func ReadBrokerLimits(ctx context.Context, c Config) (BrokerLimits, error) {
	c, err := c.withDefaults()
	if err != nil {
		return BrokerLimits{}, err
	}
	var masters map[string]string
	var errs []error
	for _, ns := range c.NameServers {
		if masters, err = brokerMasters(ctx, c, ns); err == nil {
			break
		}
		errs = append(errs, fmt.Errorf("name server %s: %w", ns, err))
	}
	if masters == nil {
		return BrokerLimits{}, fmt.Errorf("rocket: read the broker list: %w", errors.Join(errs...))
	}
	if len(masters) == 0 {
		return BrokerLimits{}, errors.New("rocket: the name servers know no broker")
	}
	out := BrokerLimits{Brokers: map[string]string{}, Unanswered: map[string]error{}, TimerWheel: true}
	first := true
	names := make([]string, 0, len(masters))
	for name := range masters {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		addr := masters[name]
		props, err := brokerConfig(ctx, c, addr)
		if err != nil {
			out.Unanswered[name] = fmt.Errorf("read the configuration of broker %s at %s: %w", name, addr, err)
			continue
		}
		out.Brokers[name] = addr
		one, err := parseBrokerLimits(props)
		if err != nil {
			return BrokerLimits{}, fmt.Errorf("rocket: broker %s at %s: %w", name, addr, err)
		}
		if first {
			out.TimerWheel, out.TimerMaxDelay, out.TimerPrecision, out.Levels = one.TimerWheel, one.TimerMaxDelay, one.TimerPrecision, one.Levels
			first = false
			continue
		}
		out.TimerWheel = out.TimerWheel && one.TimerWheel
		out.TimerMaxDelay = min(out.TimerMaxDelay, one.TimerMaxDelay)
		out.TimerPrecision = max(out.TimerPrecision, one.TimerPrecision)
		if !slices.Equal(out.Levels, one.Levels) {
			return BrokerLimits{}, fmt.Errorf("rocket: brokers disagree on messageDelayLevel: broker %s has %s, another %s",
				name, formatLevels(one.Levels), formatLevels(out.Levels))
		}
	}
	if first {
		var errs []error
		for _, name := range names {
			errs = append(errs, out.Unanswered[name])
		}
		return BrokerLimits{}, fmt.Errorf("rocket: no broker answered: %w", errors.Join(errs...))
	}
	return out, nil
}

// parseBrokerLimits reads the settings from one broker's configuration.
// A broker that predates timer messages (4.x) has no timer keys: its
// timer wheel counts as off.
func parseBrokerLimits(props map[string]string) (BrokerLimits, error) {
	var b BrokerLimits
	b.TimerWheel = props["timerWheelEnable"] == "true"
	if b.TimerWheel {
		sec, err := strconv.ParseInt(props["timerMaxDelaySec"], 10, 64)
		if err != nil || sec <= 0 {
			return b, fmt.Errorf("timerMaxDelaySec %q is not a positive number", props["timerMaxDelaySec"])
		}
		ms, err := strconv.ParseInt(props["timerPrecisionMs"], 10, 64)
		if err != nil || ms <= 0 {
			return b, fmt.Errorf("timerPrecisionMs %q is not a positive number", props["timerPrecisionMs"])
		}
		b.TimerMaxDelay, b.TimerPrecision = time.Duration(sec)*time.Second, time.Duration(ms)*time.Millisecond
	}
	levels, err := ParseLevels(props["messageDelayLevel"])
	if err != nil {
		return b, fmt.Errorf("messageDelayLevel: %w", err)
	}
	b.Levels = levels
	return b, nil
}

// ParseLevels reads a messageDelayLevel list as the broker writes it:
// space-separated numbers with a unit of s, m, h or d ("1s 5s 1m 2h 1d").
// Each level is positive and fits a time.Duration, and the list ascends.
func ParseLevels(s string) ([]time.Duration, error) {
	units := map[byte]time.Duration{'s': time.Second, 'm': time.Minute, 'h': time.Hour, 'd': 24 * time.Hour}
	var out []time.Duration
	for _, f := range strings.Fields(s) {
		unit, ok := units[f[len(f)-1]]
		n, err := strconv.ParseInt(f[:len(f)-1], 10, 64)
		if !ok || err != nil || n <= 0 {
			return nil, fmt.Errorf("level %q: want a positive number and s, m, h or d", f)
		}
		if n > math.MaxInt64/int64(unit) {
			return nil, fmt.Errorf("level %q: longer than the longest duration", f)
		}
		out = append(out, time.Duration(n)*unit)
	}
	if len(out) == 0 {
		return nil, errors.New("no levels")
	}
	if err := (broker.Limits{Levels: out}).Validate(); err != nil {
		return nil, err
	}
	return out, nil
}

// formatLevels writes levels as the broker's messageDelayLevel does.
func formatLevels(levels []time.Duration) string {
	parts := make([]string, len(levels))
	for i, d := range levels {
		switch {
		case d%(24*time.Hour) == 0:
			parts[i] = fmt.Sprintf("%dd", d/(24*time.Hour))
		case d%time.Hour == 0:
			parts[i] = fmt.Sprintf("%dh", d/time.Hour)
		case d%time.Minute == 0:
			parts[i] = fmt.Sprintf("%dm", d/time.Minute)
		case d%time.Second == 0:
			parts[i] = fmt.Sprintf("%ds", d/time.Second)
		default:
			parts[i] = d.String()
		}
	}
	return `"` + strings.Join(parts, " ") + `"`
}

// resolveLimits is what NewPublisher does with the live brokers unless
// c.TrustLimits: it reads their limits and resolves c.Limits against them.
// When the brokers cannot be asked, limits that are set are used as they
// are (with a warning) and unset ones are an error: guessing them is what
// let a configuration drift from the broker unnoticed.
func resolveLimits(ctx context.Context, c Config) (Config, error) {
	if c.TrustLimits {
		return c, nil
	}
	live, err := ReadBrokerLimits(ctx, c)
	if err != nil {
		if c.Limits.MaxHop == 0 && len(c.Limits.Levels) == 0 {
			return c, fmt.Errorf("rocket: Config.Limits unset and the broker's own cannot be read (set Config.Limits, or Config.TrustLimits to use the broker defaults): %w", err)
		}
		logger(c).Warn("rocket: cannot read the broker's limits; using the configured ones unchecked", "err", err)
		return c, nil
	}
	for name, why := range live.Unanswered {
		logger(c).Warn("rocket: a broker did not answer; its limits are assumed to be the others'", "broker", name, "err", why)
	}
	l, err := live.Resolve(c.Limits)
	if err != nil {
		return c, err
	}
	c.Limits = l
	return c, nil
}

func logger(c Config) *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}
