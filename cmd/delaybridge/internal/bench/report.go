package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"time"

	"github.com/delaybridge/delaybridge/internal/percentile"
)

type benchResult struct {
	Broker      string  `json:"broker"`
	Mode        string  `json:"mode"`
	Tasks       int     `json:"tasks"`
	Tracing     bool    `json:"tracing,omitempty"`
	Scheduled   int64   `json:"scheduled"`
	Handled     int64   `json:"handled"`
	Lost        int64   `json:"lost"`
	DupEffects  int64   `json:"dup_effects"`
	Early       int64   `json:"early"`
	ScheduleTPS float64 `json:"schedule_tps"`
	RelayTPS    float64 `json:"relay_tps"`
	// HandledTPS is the tasks handled a second from the first due time to
	// the last handled: how fast a burst drained.
	HandledTPS  float64          `json:"handled_tps"`
	BaselineTPS float64          `json:"baseline_publish_tps"`
	Lateness    map[string]int64 `json:"lateness_ms"`
	// PublishLateness is how long after its due time each task reached
	// the broker (the broker's confirm of the relay's publish), 0 for a
	// task published ahead; the relay's share of Lateness.
	PublishLateness map[string]int64 `json:"published_late_ms,omitempty"`
	// PublishAfterCommit is how long after its scheduling transaction
	// committed (or after due, if later) each task reached the broker, 0
	// for one published ahead: the relay's reaction to a task it could
	// first see at that commit, without the producer's own commit.
	PublishAfterCommit map[string]int64 `json:"published_after_commit_ms,omitempty"`
	// DeliveryLateness is how long after its due time each task's message
	// was handed to the consumer runtime: the broker's share of Lateness
	// (and the relay's, for a task that reached the broker late); the
	// rest is the consumer's.
	DeliveryLateness map[string]int64 `json:"delivered_late_ms,omitempty"`
	HandlerMode      string           `json:"handler"`
	Groups           int64            `json:"groups"`
	MeanGroup        float64          `json:"mean_group"`
	MeanGroupMS      float64          `json:"mean_group_ms"`
	ProcessCPU       float64          `json:"process_cpu_s"`
	ElapsedSecond    float64          `json:"elapsed_s"`
	// FirstDueMS and LastHandledMS (unix ms) bound the due window: the
	// work in it could not be done ahead (scripts/bench-cpu.sh measures
	// how busy the box was then).
	FirstDueMS    int64 `json:"first_due_unix_ms"`
	LastHandledMS int64 `json:"last_handled_unix_ms"`
	// The baseline's and the relay's phases (unix ms; the baseline's are 0
	// without --baseline): scripts/bench-relay.sh measures what each
	// process spent in each.
	BaselineStartMS int64 `json:"baseline_start_unix_ms"`
	BaselineEndMS   int64 `json:"baseline_end_unix_ms"`
	RelayStartMS    int64 `json:"relay_start_unix_ms"`
	RelayEndMS      int64 `json:"relay_end_unix_ms"`
	// Floor is the same workload run first through the in-process broker
	// (--floor): what the database and this process alone allowed.
	Floor *benchResult `json:"floor,omitempty"`
	// CommitLatency, with --rate, is how long a one-row autocommit UPDATE
	// took, sampled every commitSample through the run: the database's
	// commit (its log flush) that every claim waits for, so a task's
	// lateness can be no better than its tail.
	CommitLatency map[string]int64 `json:"db_commit_ms,omitempty"`
	// Trickle is --trickle's topic by phase: alone (idle), while the main
	// tasks were scheduled and published (load), from their first due time
	// to the last handled (drain), and the rest (after).
	Trickle *trickleResult `json:"trickle,omitempty"`
}

type trickleResult struct {
	Topic      string         `json:"topic"`
	Rate       float64        `json:"rate"`
	DupEffects int64          `json:"dup_effects"`
	Phases     []tricklePhase `json:"phases"`
}

func (b *benchSession) reportRelayOnly() error {
	res, out := b.res, b.env.Stdout
	fmt.Fprintf(out, "bench %s (%s), relay only: %d tasks scheduled at %.0f/s, relayed at %.0f/s", res.Broker, res.Mode, res.Scheduled, res.ScheduleTPS, res.RelayTPS)
	if b.o.baseline {
		fmt.Fprintf(out, " (baseline confirmed publish %.0f/s, relay/baseline %.2f)", res.BaselineTPS, res.RelayTPS/res.BaselineTPS)
	}
	fmt.Fprintln(out)
	if b.o.asJSON {
		j, _ := json.Marshal(map[string]any{"broker": res.Broker, "mode": res.Mode, "tasks": b.o.tasks, "scheduled": res.Scheduled,
			"schedule_tps": res.ScheduleTPS, "relay_tps": res.RelayTPS, "baseline_publish_tps": res.BaselineTPS, "process_cpu_s": processCPU(),
			"baseline_start_unix_ms": res.BaselineStartMS, "baseline_end_unix_ms": res.BaselineEndMS,
			"relay_start_unix_ms": res.RelayStartMS, "relay_end_unix_ms": res.RelayEndMS})
		fmt.Fprintln(out, string(j))
	}
	return nil
}

// report counts what was lost, early or applied twice, prints the summary
// and fails the run when an invariant broke.
func (b *benchSession) report() error {
	o, run, res := b.o, b.tasks, &b.res
	res.Handled = run.count.Load()
	res.Lost = int64(o.tasks) - res.Handled
	res.Early = run.early.Load()
	if o.handler == "db" {
		// This run's orders only: a --floor run's are in the table too.
		if err := b.db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM bench_orders WHERE id LIKE ? AND effects > 1", run.id+"-%").Scan(&res.DupEffects); err != nil {
			return err
		}
	} else {
		for i := range run.runs {
			if run.runs[i].Load() > 1 {
				res.DupEffects++
			}
		}
	}
	var late []int64
	for i := range run.handled {
		if res.FirstDueMS == 0 || run.due[i] < res.FirstDueMS {
			res.FirstDueMS = run.due[i]
		}
		if t := run.handled[i].Load(); t != 0 {
			late = append(late, max(t/1000-run.due[i], 0))
			res.LastHandledMS = max(res.LastHandledMS, t/1000)
		}
	}
	if span := res.LastHandledMS - res.FirstDueMS; span > 0 {
		res.HandledTPS = float64(res.Handled) / (float64(span) / 1000)
	}
	l := percentile.Summarize(late)
	res.Lateness = map[string]int64{"p50": l.P50, "p90": l.P90, "p99": l.P99, "max": l.Max}
	res.ElapsedSecond = time.Since(b.scheduleStart).Seconds()
	res.ProcessCPU = processCPU()
	if res.Groups = run.groups.Load(); res.Groups > 0 {
		res.MeanGroup = float64(run.grouped.Load()) / float64(res.Groups)
		res.MeanGroupMS = float64(run.groupMicros.Load()) / 1000 / float64(res.Groups)
	}

	if t := b.trickle; t != nil {
		dup, err := t.duplicates(context.Background(), o.handler == "db")
		if err != nil {
			return err
		}
		res.Trickle = &trickleResult{Topic: t.topic, Rate: t.rate, DupEffects: dup, Phases: []tricklePhase{
			t.summary(b.trickleStart.UnixMilli(), b.scheduleStart.UnixMilli(), "idle"),
			t.summary(b.scheduleStart.UnixMilli(), res.FirstDueMS, "load"),
			t.summary(res.FirstDueMS, res.LastHandledMS+1, "drain"),
			t.summary(res.LastHandledMS+1, 1<<62, "after"),
		}}
		if err := t.failed(); err != nil {
			return err
		}
	}

	var delivered []int64
	for i := range run.delivered {
		if t := run.delivered[i].Load(); t != 0 {
			delivered = append(delivered, max(t/1000-run.due[i], 0))
		}
	}
	if len(delivered) > 0 {
		d := percentile.Summarize(delivered)
		res.DeliveryLateness = map[string]int64{"p50": d.P50, "p90": d.P90, "p99": d.P99, "max": d.Max}
	}
	if !b.floorRun {
		p, c := run.publishLateness()
		res.PublishLateness = map[string]int64{"p50": p.P50, "p90": p.P90, "p99": p.P99, "max": p.Max, "tasks": int64(p.Count)}
		if c.Count > 0 {
			res.PublishAfterCommit = map[string]int64{"p50": c.P50, "p90": c.P90, "p99": c.P99, "max": c.Max, "tasks": int64(c.Count)}
		}
	}

	out := b.env.Stdout
	if b.floorRun {
		fmt.Fprintf(out, "floor (%s), handler %s: handled %d, lost %d, early %d, duplicate effects %d; relayed at %.0f/s\nfloor lateness ms: p50 %d p90 %d p99 %d max %d\n",
			res.Mode, o.handler, res.Handled, res.Lost, res.Early, res.DupEffects, res.RelayTPS, l.P50, l.P90, l.P99, l.Max)
		return res.broken(o.handler)
	}
	fmt.Fprintf(out, "bench %s (%s), handler %s: %d tasks, scheduled %d at %.0f/s, relayed at %.0f/s", res.Broker, res.Mode, o.handler, o.tasks, res.Scheduled, res.ScheduleTPS, res.RelayTPS)
	if o.baseline {
		fmt.Fprintf(out, " (baseline confirmed publish %.0f/s, relay/baseline %.2f)", res.BaselineTPS, res.RelayTPS/res.BaselineTPS)
	}
	fmt.Fprintf(out, "\nhandled %d, lost %d, early %d, duplicate effects %d\nlateness ms: p50 %d p90 %d p99 %d max %d\n",
		res.Handled, res.Lost, res.Early, res.DupEffects, l.P50, l.P90, l.P99, l.Max)
	if p := res.PublishLateness; p != nil {
		fmt.Fprintf(out, "reached the broker after due, ms: p50 %d p90 %d p99 %d max %d\n", p["p50"], p["p90"], p["p99"], p["max"])
	}
	if d := res.DeliveryLateness; d != nil {
		fmt.Fprintf(out, "delivered to the consumer after due, ms: p50 %d p90 %d p99 %d max %d\n", d["p50"], d["p90"], d["p99"], d["max"])
	}
	if c := res.PublishAfterCommit; c != nil {
		fmt.Fprintf(out, "reached the broker after its scheduling commit (or due, if later; %d tasks), ms: p50 %d p90 %d p99 %d max %d\n", c["tasks"], c["p50"], c["p90"], c["p99"], c["max"])
	}
	if res.Groups > 0 {
		fmt.Fprintf(out, "group commit: %d transactions of %.1f messages on average, %.1f ms each\n", res.Groups, res.MeanGroup, res.MeanGroupMS)
	}
	if c := res.CommitLatency; c != nil {
		fmt.Fprintf(out, "database commit (one-row UPDATE every %v through the run, %d samples), ms: p50 %d p90 %d p99 %d max %d\n",
			commitSample, c["samples"], c["p50"], c["p90"], c["p99"], c["max"])
	}
	if t := res.Trickle; t != nil {
		printPhases(out, t.Topic, t.Phases)
	}
	if f := res.Floor; f != nil {
		fmt.Fprintf(out, "floor, the same workload through the database alone just before: lateness ms p50 %d p90 %d p99 %d max %d\n",
			f.Lateness["p50"], f.Lateness["p90"], f.Lateness["p99"], f.Lateness["max"])
	}
	if o.asJSON {
		j, _ := json.Marshal(res)
		fmt.Fprintln(out, string(j))
	}
	return res.broken(o.handler)
}

// broken fails a run that lost a task, ran one early or, with the
// database handler, applied one's effect twice. The noop handler runs
// without the outbox, so a redelivery runs it again: its duplicates are
// reported, not a failure.
func (res *benchResult) broken(handler string) error {
	if t := res.Trickle; t != nil {
		var lost, early int
		for _, p := range t.Phases {
			lost, early = lost+p.Lost, early+p.Early
		}
		if lost > 0 || early > 0 || (handler == "db" && t.DupEffects > 0) {
			return fmt.Errorf("bench: %s lost %d, early %d, duplicate effects %d", t.Topic, lost, early, t.DupEffects)
		}
	}
	if res.Lost > 0 || res.Early > 0 || (handler == "db" && res.DupEffects > 0) {
		return fmt.Errorf("bench: lost %d, early %d, duplicate effects %d", res.Lost, res.Early, res.DupEffects)
	}
	return nil
}

// processCPU returns the CPU seconds (user and system) this process used.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
