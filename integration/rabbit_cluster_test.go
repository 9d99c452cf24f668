package integration

// RabbitMQ as users run it: a 3-node cluster (scripts/cluster.sh rabbit,
// started for this test only) whose quorum queues hold the ladder and the
// topic queues. The node leading the busiest queue is killed with kill -9
// while tasks flow.

import (
	"encoding/json"
	"net/url"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// clusterQueue is one row of rabbitmqctl list_queues name leader members
// online --formatter json.
type clusterQueue struct {
	Name    string   `json:"name"`
	Leader  string   `json:"leader"`
	Members []string `json:"members"`
	Online  []string `json:"online"`
}

func clusterQueues(t *testing.T, c testenv.RabbitCluster, via int, prefix string) []clusterQueue {
	t.Helper()
	var all, out []clusterQueue
	raw := c.Ctl(t, via, "list_queues", "name", "leader", "members", "online", "--formatter", "json")
	if err := json.Unmarshal([]byte(raw), &all); err != nil {
		t.Fatalf("list_queues: %v\n%s", err, raw)
	}
	for _, q := range all {
		if strings.HasPrefix(q.Name, prefix+".") {
			out = append(out, q)
		}
	}
	return out
}

func TestRabbitCluster_KillingTheBusiestLeaderLosesNothing(t *testing.T) {
	testenv.SkipIfShort(t, "starts a 3-node RabbitMQ cluster and kills a node")
	cl := testenv.StartRabbitCluster(t)
	var nodes []string
	for _, raw := range cl.URLs[1:] {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, u.Host)
	}
	prefix := testenv.Name("cl")
	// A short lead, and a relay that publishes every task at once, so the
	// tasks go through the ladder's levels (with the default lead they
	// would skip it). RabbitMQ 3.10 is what this box runs: at-least-once
	// dead-lettering would stall the hops between queues the dead node led
	// (docs/deployment.md), at-most-once does not.
	cfg := rabbit.Config{URL: cl.URLs[0], Nodes: nodes, Prefix: prefix, Unit: faultRabbitUnit, Depth: faultRabbitDepth,
		Lead: 200 * time.Millisecond, DeadLettering: rabbit.AtMostOnce, ConnectionName: prefix, Logger: quiet()}

	f := newFlow(t)
	pub, sub := rabbitClients(t, cfg)
	f.consume(t, pub, sub)
	const grace = 10 * time.Second
	f.relayAndScan(t, pub, outbox.RelayConfig{Lookahead: -1}, grace)

	// The order service: 40 orders a second, each due 1-4 s later (so the
	// later ones go through two ladder levels).
	orders := f.startOrders(t, "c", func(i int64) time.Duration { return time.Second + time.Duration(i*7919%3000)*time.Millisecond })

	time.Sleep(6 * time.Second)
	// Every queue of the ladder and the topic is a quorum queue on all three.
	qs := clusterQueues(t, cl, 0, prefix)
	if len(qs) < faultRabbitDepth+1 {
		t.Fatalf("%d queues under %s, want at least %d ladder levels and the topic's", len(qs), prefix, faultRabbitDepth)
	}
	leads := map[string]int{}
	var victim string
	for _, q := range qs {
		if len(q.Members) != 3 {
			t.Errorf("queue %s has members %v, want all three nodes", q.Name, q.Members)
		}
		leads[q.Leader]++
		if q.Name == prefix+".q."+f.topic { // every task passes through it
			victim = q.Leader
		}
	}
	vi := slices.Index(cl.Nodes, victim)
	if vi < 0 {
		t.Fatalf("the topic queue's leader %q is not a cluster node %v", victim, cl.Nodes)
	}
	t.Logf("%d queues, leaders %v; killing %s, leader of the topic queue", len(qs), leads, victim)
	before := time.Now()
	cl.Kill(t, vi)
	killed := time.Now()

	time.Sleep(15 * time.Second)
	orders.stop()
	total := orders.total()
	f.waitDone(t, total, 2*time.Minute)
	f.checkOnce(t, total)

	// The killed leader's queues have a new one; every queue keeps its
	// three members, two of them online.
	live := (vi + 1) % 3
	for _, q := range clusterQueues(t, cl, live, prefix) {
		if q.Leader == victim || len(q.Members) != 3 || len(q.Online) != 2 {
			t.Errorf("after the kill, queue %s: leader %s, members %v, online %v", q.Name, q.Leader, q.Members, q.Online)
		}
	}

	// Lateness: normal is the p99 of tasks due before the kill. The broker
	// has recovered once tasks are seldom late by more than twice that (and
	// more than 500 ms) again: of those due from settled, 8 s after the
	// kill, on, at most half may be. A loaded box stalls now and then with
	// no fault in the cluster (a GC pause or an fsync of a second or three,
	// three Erlang nodes and the other servers on two cores), and the tasks
	// due during a stall are late, forty for each second of it, of the
	// hundreds due after settled: a CI run had 72 of 256 late, the last
	// due 13.8 s after the kill, with 18 rescued. A broker that has not
	// resumed makes nearly all of them late (nine in ten).
	type sample struct {
		due  time.Time
		late time.Duration
	}
	var samples []sample
	f.mu.Lock()
	for key, at := range f.handled {
		_, due := orders.times(key)
		samples = append(samples, sample{due, at.Sub(due)})
	}
	f.mu.Unlock()
	sort.Slice(samples, func(i, j int) bool { return samples[i].due.Before(samples[j].due) })
	var normal []time.Duration
	for _, s := range samples {
		if s.due.Before(before) {
			normal = append(normal, s.late)
		}
	}
	slices.Sort(normal)
	if len(normal) == 0 {
		t.Fatal("no task was due before the kill")
	}
	p99 := normal[len(normal)*99/100]
	limit := max(2*p99, 500*time.Millisecond)
	settled := killed.Add(grace - 2*time.Second)
	var lastLate time.Time
	var worst time.Duration
	after, tail, tailLate := 0, 0, 0
	for _, s := range samples {
		if !s.due.After(killed) {
			continue
		}
		after++
		worst = max(worst, s.late)
		if s.late > limit {
			lastLate = s.due
		}
		if s.due.After(settled) {
			tail++
			if s.late > limit {
				tailLate++
			}
		}
	}
	recovery := time.Duration(0)
	if !lastLate.IsZero() {
		recovery = lastLate.Sub(killed)
	}
	rescued := f.count(t, "SELECT COALESCE(SUM(rescues), 0) FROM delay_task")
	early := f.count(t, "SELECT COUNT(*) FROM delay_task WHERE done_ms < due_ms")
	t.Logf("%d tasks: lost 0, dup_effects 0, early %d, rescued by the scanner %d; lateness p99 before the kill %v, worst after %v; "+
		"of %d tasks due %v or more after the kill, %d were late by more than %v; the last such task was due %v after the kill",
		total, early, rescued, p99.Round(time.Millisecond), worst.Round(time.Millisecond),
		tail, settled.Sub(killed).Round(100*time.Millisecond), tailLate, limit.Round(time.Millisecond), recovery.Round(100*time.Millisecond))
	if early != 0 {
		t.Errorf("%d tasks done before their due time", early)
	}
	// The broker, not the scanner, brings delivery back: lateness is
	// normal again well before the scanner's grace could have rescued
	// anything, and the scanner rescues only what was dead-lettered into a
	// queue whose leader was being elected (5-30 in six runs, back to
	// normal 0.4-3.7 s after the kill). At-least-once dead-lettering on
	// RabbitMQ 3.10 fails both: 448-631 rescued, tasks late until 18.6-19 s
	// after the kill, the end of the run, and 342 of the 379 due after
	// settled late. The bounds leave room for a slow box: a message dropped
	// while leaving a high level can be due a few seconds after the kill,
	// hence settled at 8 s; tasks keep coming due for 19 s, so a few
	// hundred are due after it.
	if tail < 100 {
		t.Errorf("only %d tasks due %v or more after the kill, want at least 100 to judge recovery by", tail, settled.Sub(killed).Round(100*time.Millisecond))
	} else if tailLate*2 > tail {
		t.Errorf("%d of the %d tasks due %v or more after the kill were late by more than %v: the broker did not resume delivery by itself",
			tailLate, tail, settled.Sub(killed).Round(100*time.Millisecond), limit.Round(time.Millisecond))
	}
	if rescued*5 > after {
		t.Errorf("the scanner rescued %d tasks, more than a fifth of the %d due after the kill: the broker did not resume delivery by itself", rescued, after)
	}
}
