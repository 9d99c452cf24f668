package broker

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Topology is how a process meets its broker: the adapter and the settings
// (prefix, consumer group, delay mode, limits, ladder unit and depth) that
// every relay and consumer of one outbox must share. Two processes that
// disagree on one of them talk past each other: a relay publishing under
// prefix "delaybridge" and a consumer reading under "shop" leave every
// task in a queue nobody reads. The adapters build theirs
// (rabbit.Config.Topology, rocket.Config.Topology); outbox.Announce
// compares it with the other processes'.
type Topology struct {
	// Broker names the adapter: "rabbit" or "rocket".
	Broker string `json:"broker"`
	// Settings are the adapter's shared settings by name, as text.
	Settings map[string]string `json:"settings"`
}

// LimitSettings returns the settings Limits adds to a Topology: max_hop
// and, with levels, levels. Precision is left out: it is how exactly one
// process waits, and processes may differ in it harmlessly.
//
// With levels, max_hop is the longest level a hop may use, so limits that
// allow the same levels compare equal however MaxHop spells it (0, or any
// value at or above the last level).
func LimitSettings(l Limits) map[string]string {
	if len(l.Levels) > 0 {
		lv := make([]string, len(l.Levels))
		usable := time.Duration(0)
		for i, d := range l.Levels {
			lv[i] = d.String()
			if l.MaxHop == 0 || d <= l.MaxHop {
				usable = d
			}
		}
		return map[string]string{"max_hop": usable.String(), "levels": strings.Join(lv, " ")}
	}
	return map[string]string{"max_hop": l.MaxHop.String()}
}

// String renders t as "rabbit depth=26 mode=ladder …", settings sorted.
func (t Topology) String() string {
	var b strings.Builder
	b.WriteString(t.Broker)
	for _, k := range t.keys() {
		fmt.Fprintf(&b, " %s=%s", k, t.Settings[k])
	}
	return b.String()
}

func (t Topology) keys() []string {
	keys := make([]string, 0, len(t.Settings))
	for k := range t.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Diff lists how other differs from t, one line per difference naming both
// values ("prefix: \"shop\" here, \"delaybridge\" there"): the broker, and
// each setting both name. A setting only one of them names is no
// difference, so a process may leave out what it does not use.
func (t Topology) Diff(other Topology) []string {
	if t.Broker != other.Broker {
		return []string{fmt.Sprintf("broker: %q here, %q there", t.Broker, other.Broker)}
	}
	var out []string
	for _, k := range t.keys() {
		if v, ok := other.Settings[k]; ok && v != t.Settings[k] {
			out = append(out, fmt.Sprintf("%s: %q here, %q there", k, t.Settings[k], v))
		}
	}
	return out
}
