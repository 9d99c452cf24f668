package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// UnconsumedScan is how many overdue tasks Unconsumed reads at most.
const UnconsumedScan = overdueScan

// Unconsumed returns the topics that have published tasks more than grace
// past due and no live consumer presence (within expiry), with how many
// such tasks each: the tasks a consumer with another prefix or group, or no
// consumer at all, leaves behind. A task counts from its due time alone,
// as Stats.Overdue does: however recently the scanner re-published it, a
// task long past due and not done has no one handling it. Like
// Stats.Overdue it looks at the oldest overdueScan overdue tasks at most,
// so its cost stays bounded however many there are; the counts are then
// lower bounds. A topic whose consumers do not announce themselves
// (Announce) shows here too. When the counts add up to UnconsumedScan,
// each is a lower bound.
func Unconsumed(ctx context.Context, q outbox.Querier, now time.Time, grace, expiry time.Duration) (map[string]int, error) {
	rows, err := q.QueryContext(ctx, `SELECT topic, COUNT(*) FROM (
  SELECT topic FROM delay_task FORCE INDEX (ix_delay_task_state_due)
  WHERE state = 'published' AND due_ms < ? ORDER BY due_ms LIMIT ?) o GROUP BY topic`,
		now.Add(-grace).UnixMilli(), overdueScan)
	if err != nil {
		return nil, fmt.Errorf("outbox: overdue topics: %w", err)
	}
	overdue := map[string]int{}
	for rows.Next() {
		var t string
		var n int
		if err := rows.Scan(&t, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: overdue topics: %w", err)
		}
		overdue[t] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: overdue topics: %w", err)
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("outbox: overdue topics: %w", err)
	}
	if len(overdue) == 0 {
		return overdue, nil
	}
	live, err := outbox.LivePresences(ctx, q, expiry)
	if err != nil {
		return nil, err
	}
	for _, p := range live {
		if p.Role != outbox.RoleConsumer {
			continue
		}
		for t := range overdue {
			if slices.Contains(p.Topics, t) {
				delete(overdue, t)
			}
		}
	}
	return overdue, nil
}

// TopologyMismatches says how the broker topologies of the live
// processes in live differ: one line per setting that differs between two
// configurations, naming the processes of each (`prefix: relay r1
// "delaybridge"; consumer c1, c2 "shop"`). Processes of the same role and
// the same topology count as one configuration, so the lines grow with
// the configurations, not the processes. Announce refuses a consumer that
// differs from a live process, but a relay that differs only logs it, and
// its tasks go to queues no consumer reads: status, doctor and the console
// show these lines. A setting only one side names is no difference, as in
// broker.Topology.Diff.
func TopologyMismatches(live []outbox.Presence) []string {
	type config struct {
		role      outbox.Role
		topo      broker.Topology
		instances []string
	}
	var configs []*config
	byKey := map[string]*config{}
	for _, p := range live {
		topo, err := json.Marshal(p.Topology) // maps marshal in key order
		if err != nil {
			continue
		}
		key := string(p.Role) + " " + string(topo)
		c := byKey[key]
		if c == nil {
			c = &config{role: p.Role, topo: p.Topology}
			byKey[key] = c
			configs = append(configs, c)
		}
		c.instances = append(c.instances, p.Instance)
	}
	// Relays first, then by their first instance: a stable order.
	slices.SortFunc(configs, func(a, b *config) int {
		if (a.role == outbox.RoleRelay) != (b.role == outbox.RoleRelay) {
			if a.role == outbox.RoleRelay {
				return -1
			}
			return 1
		}
		return strings.Compare(a.instances[0], b.instances[0])
	})
	side := func(c *config, v string) string {
		names := c.instances
		more := ""
		if len(names) > 3 {
			names, more = names[:3], fmt.Sprintf(" (and %d more)", len(c.instances)-3)
		}
		return fmt.Sprintf("%s %s%s %q", c.role, strings.Join(names, ", "), more, v)
	}
	var out []string
	for i, a := range configs {
		for _, b := range configs[i+1:] {
			if a.topo.Broker != b.topo.Broker {
				out = append(out, "broker: "+side(a, a.topo.Broker)+"; "+side(b, b.topo.Broker))
				continue
			}
			keys := make([]string, 0, len(a.topo.Settings))
			for k := range a.topo.Settings {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				if v, ok := b.topo.Settings[k]; ok && v != a.topo.Settings[k] {
					out = append(out, k+": "+side(a, a.topo.Settings[k])+"; "+side(b, v))
				}
			}
		}
	}
	return out
}
