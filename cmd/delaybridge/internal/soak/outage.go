package soak

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
)

// outage is what soak saw of a broker outage (--outage-at): when it
// stopped and started the broker, the overdue tasks when it started, and
// how long they took to drain.
type outage struct {
	StoppedS float64 `json:"stopped_at_s"` // since the start
	DownS    float64 `json:"down_s"`
	// Before is the overdue tasks just before the stop: what counts as
	// drained.
	Before int64 `json:"overdue_before"`
	// Backlog is the overdue tasks when the broker was started again.
	Backlog int64 `json:"overdue_at_start"`
	// DrainedS is how long after the start the overdue tasks were back
	// to Before, 0 when they never were; DrainRate is Backlog over it.
	DrainedS  float64 `json:"drained_after_s"`
	DrainRate float64 `json:"drain_tasks_per_s"`
	Err       string  `json:"error,omitempty"`
}

func (o *outage) drained() string {
	switch {
	case o.Err != "":
		return "failed: " + o.Err
	case o.DrainedS == 0:
		return "not drained by the end"
	}
	return fmt.Sprintf("drained in %.1f s, %.0f tasks a second", o.DrainedS, o.DrainRate)
}

// overdueCap bounds the overdue count, so a poll stays cheap at the
// seeds' scale: past it the backlog is reported as the cap.
const overdueCap = 2_000_000

// overdue counts the soak's tasks past due and not finished a second
// after due: what a broker outage leaves behind.
func (s *soak) overdue(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT 1 FROM delay_task
  WHERE state IN (?, ?) AND due_ms < ? AND topic = ? LIMIT ?) o`,
		string(outbox.StatePending), string(outbox.StatePublished), time.Now().Add(-time.Second).UnixMilli(), Topic, overdueCap).Scan(&n)
	return n, err
}

// runOutage stops the broker at --outage-at, starts it --outage-for
// later, and watches the overdue tasks drain.
func (s *soak) runOutage(ctx context.Context) {
	o := &outage{}
	set := func() {
		s.omu.Lock()
		cp := *o
		s.outage = &cp
		s.omu.Unlock()
	}
	fail := func(err error) { o.Err = err.Error(); set(); s.env.Log.Error("soak: outage", "err", err) }
	if !sleepUntil(ctx, s.start.Add(s.o.outageAt)) {
		return
	}
	var err error
	if o.Before, err = s.overdue(ctx); err != nil {
		fail(err)
		return
	}
	stopped := time.Now()
	o.StoppedS = stopped.Sub(s.start).Seconds()
	if err := s.shell(ctx, s.o.outageStop); err != nil {
		fail(fmt.Errorf("--outage-stop: %w", err))
		return
	}
	fmt.Fprintf(s.env.Stderr, "soak: broker stopped at %.0f s (%d tasks overdue before)\n", o.StoppedS, o.Before)
	set()
	if !sleepUntil(ctx, stopped.Add(s.o.outageFor)) {
		// Never leave the broker down: start it even when soak ends.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := s.shell(sctx, s.o.outageStart); err != nil {
			fail(fmt.Errorf("--outage-start: %w", err))
		}
		return
	}
	if err := s.shell(ctx, s.o.outageStart); err != nil {
		fail(fmt.Errorf("--outage-start: %w", err))
		return
	}
	started := time.Now()
	o.DownS = started.Sub(stopped).Seconds()
	if o.Backlog, err = s.overdue(ctx); err != nil {
		fail(err)
		return
	}
	fmt.Fprintf(s.env.Stderr, "soak: broker started after %.0f s; %d tasks overdue\n", o.DownS, o.Backlog)
	set()
	for sleepUntil(ctx, time.Now().Add(time.Second)) {
		n, err := s.overdue(ctx)
		if err != nil {
			fail(err)
			return
		}
		if n <= o.Before {
			o.DrainedS = time.Since(started).Seconds()
			o.DrainRate = float64(o.Backlog-n) / o.DrainedS
			fmt.Fprintf(s.env.Stderr, "soak: the overdue tasks drained %.1f s after the start\n", o.DrainedS)
			set()
			return
		}
	}
}

// shell runs cmd with sh -c in soak's child environment, and
// SOAK_RUN_PID the pid of the delaybridge run process (so an outage can
// be the relay's: kill -STOP, then kill -CONT), its output on soak's
// stderr.
func (s *soak) shell(ctx context.Context, cmd string) error {
	c := exec.CommandContext(ctx, "sh", "-c", cmd)
	c.Env = append(s.env.ChildEnv(), "SOAK_RUN_PID="+strconv.Itoa(s.runPID))
	c.Stdout, c.Stderr = s.env.Stderr, s.env.Stderr
	return c.Run()
}

// sleepUntil waits until t; false when ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	tm := time.NewTimer(time.Until(t))
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}
