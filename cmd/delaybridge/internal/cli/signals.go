package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// PresenceExpiry is how long after its last heartbeat a consumer stops
// counting for status and /metrics: outbox.PresenceConfig's default.
const PresenceExpiry = 3 * outbox.DefaultHeartbeat

// PrintUnconsumed writes status's lines for overdue topics no live
// consumer announced itself for.
func PrintUnconsumed(w io.Writer, topics map[string]int) {
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	sort.Strings(names)
	total := 0
	for _, n := range topics {
		total += n
	}
	// The check reads the oldest UnconsumedScan overdue tasks only: when it
	// saw that many, each count may be short.
	atLeast := ""
	if total >= ops.UnconsumedScan {
		atLeast = "at least "
	}
	for _, t := range names {
		fmt.Fprintf(w, "NO CONSUMER: topic %s has %s%d overdue tasks and no live consumer (none running, or one whose prefix or group differs from the relay's)\n",
			Printable(t), atLeast, topics[t])
	}
	if atLeast != "" {
		fmt.Fprintf(w, "(these counts come from the oldest %d overdue tasks only)\n", ops.UnconsumedScan)
	}
}

// Processes is what the live presences say about one outbox's relays and
// consumers, beside its overdue counts: the signals status, doctor, the
// console and /metrics give when work is stuck for want of a process.
type Processes struct {
	// LiveRelays and LiveConsumers count the live presences by role.
	LiveRelays    int `json:"live_relays"`
	LiveConsumers int `json:"live_consumers"`
	// OverduePending is Stats.OverduePending: pending tasks past due by
	// the grace.
	OverduePending int `json:"-"`
	// NoRelay is set when pending tasks are past due and no relay is live.
	NoRelay bool `json:"no_live_relay"`
	// Mismatches are ops.TopologyMismatches of the live Processes.
	Mismatches []string `json:"topology_mismatches"`
}

// ReadProcesses reads the live presences and weighs them against st.
func ReadProcesses(ctx context.Context, q outbox.Querier, st *ops.Stats) (Processes, error) {
	live, err := outbox.LivePresences(ctx, q, PresenceExpiry)
	if err != nil {
		return Processes{}, err
	}
	p := Processes{OverduePending: st.OverduePending, Mismatches: ops.TopologyMismatches(live)}
	if p.Mismatches == nil {
		p.Mismatches = []string{}
	}
	for _, pr := range live {
		switch pr.Role {
		case outbox.RoleRelay:
			p.LiveRelays++
		case outbox.RoleConsumer:
			p.LiveConsumers++
		}
	}
	p.NoRelay = p.OverduePending > 0 && p.LiveRelays == 0
	return p, nil
}

// Lines are the processes' signals in words, one a line, none when all
// is well.
func (p Processes) Lines() []string {
	var out []string
	switch {
	case p.NoRelay:
		out = append(out, fmt.Sprintf("NO RELAY: %d pending tasks past due and no live relay (start `delaybridge run`)", p.OverduePending))
	case p.OverduePending > 0:
		out = append(out, fmt.Sprintf("RELAY BEHIND: %d pending tasks past due though %d relay(s) are live: its publishes fail or it is behind (see its log)", p.OverduePending, p.LiveRelays))
	}
	for _, m := range p.Mismatches {
		out = append(out, "TOPOLOGY MISMATCH: "+Printable(m)+": tasks may sit in queues nobody reads")
	}
	return out
}

// Signals are status's lines about the processes an outbox lacks: topics
// with overdue tasks and no live consumer, pending tasks past due with no
// relay (or a relay behind), and live processes whose broker topologies
// differ.
func Signals(ctx context.Context, db outbox.Querier, st *ops.Stats, now time.Time, grace time.Duration) ([]string, error) {
	unconsumed, err := ops.Unconsumed(ctx, db, now, grace, PresenceExpiry)
	if err != nil {
		return nil, err
	}
	procs, err := ReadProcesses(ctx, db, st)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	PrintUnconsumed(&buf, unconsumed)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if lines[0] == "" {
		lines = nil
	}
	return append(lines, procs.Lines()...), nil
}
