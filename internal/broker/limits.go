package broker

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Limits describes what one broker hop can do. The planner uses them to chain
// hops until a message's DeliverAt; ops set them to match the live broker
// (delaybridge doctor compares the two).
type Limits struct {
	// MaxHop is the longest delay one publish may ask for: RocketMQ's
	// timerMaxDelaySec, the top of a RabbitMQ ladder, the delayed-message
	// plugin's 2^32-1 ms. Zero means no limit.
	MaxHop time.Duration
	// Levels, when set, are the only delays a hop may use, ascending
	// (RocketMQ 4.x delay levels). A hop then takes the largest level that
	// does not pass the due time, and the remainder below the smallest level
	// is waited out by the consumer.
	Levels []time.Duration
	// Precision is how far from the asked delay the broker may deliver, early
	// or late (a timer wheel slot, a ladder unit). An adapter may ask for up
	// to this much before the due time (RocketMQ's timer publisher does), so
	// the consumer holds a message that arrives up to twice this early
	// (ConsumerConfig.HoldWindow). Zero means one millisecond.
	Precision time.Duration
	// Lookahead is the broker's advice to the relay: how long before its
	// due time a task should move from the database into this broker when
	// the relay is not told otherwise (outbox.RelayConfig.Lookahead). Long
	// enough for a burst due at one instant to be published before it; short
	// enough that tasks due later wait in the database, where they cost the
	// broker no memory and a cancel costs nothing. Zero: no advice, publish
	// every pending task at once.
	Lookahead time.Duration
	// RelayWorkers is the broker's advice on how many claim loops a relay
	// runs when it is not told (outbox.RelayConfig.Workers): enough that
	// some publish while others claim and mark their rows. Zero: no
	// advice, the relay's own default.
	RelayWorkers int
}

// Validate reports limits no planner can work with.
func (l Limits) Validate() error {
	if l.MaxHop < 0 || l.Precision < 0 || l.Lookahead < 0 || l.RelayWorkers < 0 {
		return errors.New("broker: limits: negative MaxHop, Precision, Lookahead or RelayWorkers")
	}
	for i, lv := range l.Levels {
		if lv <= 0 {
			return fmt.Errorf("broker: limits: level %d is %v; levels must be positive", i+1, lv)
		}
		if i > 0 && lv <= l.Levels[i-1] {
			return fmt.Errorf("broker: limits: level %d (%v) is not above level %d (%v); levels must ascend", i+1, lv, i, l.Levels[i-1])
		}
	}
	if len(l.Levels) > 0 && l.MaxHop > 0 && l.Levels[0] > l.MaxHop {
		return fmt.Errorf("broker: limits: the smallest level %v exceeds MaxHop %v", l.Levels[0], l.MaxHop)
	}
	return nil
}

// HopPlan is the planner's answer for one publish: how long the broker
// holds the message this time. (Message.Hop counts the re-publishes.)
type HopPlan struct {
	// Delay is how long the broker should hold the message, from now. Zero
	// means deliver at once.
	Delay time.Duration
	// Level is the 1-based index of Delay in Limits.Levels, or 0 when the
	// limits have no levels or Delay is zero.
	Level int
	// Last is true when no further hop will be needed: after Delay the
	// message is due, or is early by less than another hop could cover and
	// the consumer waits out the rest.
	Last bool
}

// Plan says how to publish a message due at due when the time is now.
//
// Invariants (fuzzed in planner_test.go): Delay never exceeds MaxHop; with
// levels, Delay is zero or one of the levels; now+Delay never passes due, so
// the hops of a chain never add up past the due time; a due time in the past
// or present gives Delay 0 and Last. The number of hops for a remainder R is
// at most MaxHops(R).
func (l Limits) Plan(now, due time.Time) HopPlan {
	remaining := due.Sub(now)
	if remaining <= 0 {
		return HopPlan{Last: true}
	}
	if len(l.Levels) == 0 {
		if l.MaxHop == 0 || remaining <= l.MaxHop {
			return HopPlan{Delay: remaining, Last: true}
		}
		return HopPlan{Delay: l.MaxHop}
	}
	// Largest usable level that fits in the remainder.
	i, found := slices.BinarySearch(l.Levels, remaining)
	if !found {
		i--
	}
	for i >= 0 && l.MaxHop > 0 && l.Levels[i] > l.MaxHop {
		i--
	}
	if i < 0 {
		// Shorter than the smallest level: deliver now, the consumer holds it.
		return HopPlan{Last: true}
	}
	d := l.Levels[i]
	return HopPlan{Delay: d, Level: i + 1, Last: remaining-d < l.Levels[0]}
}

// MaxHops bounds the number of publishes Plan chains for a remainder r,
// counting the last one. Without levels it is ceil(r / MaxHop). With levels,
// whose largest usable one is top, the chain takes floor(r / top) top hops;
// then the remainder is below top, and the greedy choice uses each smaller
// level i at most ceil(level[i+1] / level[i]) - 1 times, because the
// remainder it works on is below level[i+1]. One more publish covers the case
// where the remainder is below the smallest level and goes out with no delay.
func (l Limits) MaxHops(r time.Duration) int {
	if r <= 0 {
		return 1
	}
	if len(l.Levels) == 0 {
		if l.MaxHop == 0 {
			return 1
		}
		return int((r + l.MaxHop - 1) / l.MaxHop)
	}
	usable := l.Levels
	for len(usable) > 1 && l.MaxHop > 0 && usable[len(usable)-1] > l.MaxHop {
		usable = usable[:len(usable)-1]
	}
	top := usable[len(usable)-1]
	n := int(r/top) + 1
	for i := 0; i+1 < len(usable); i++ {
		n += int((usable[i+1]+usable[i]-1)/usable[i]) - 1
	}
	return n
}

// precision returns Precision with its documented default.
func (l Limits) precision() time.Duration {
	if l.Precision <= 0 {
		return time.Millisecond
	}
	return l.Precision
}
