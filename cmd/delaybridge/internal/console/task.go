package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/rocket"
)

type event struct {
	At   time.Time
	What string
}

type taskData struct {
	Now      time.Time
	T        *ops.Detail
	Reveal   bool
	Key      string
	Payload  string
	Binary   bool
	Cut      bool
	Timeline []event
	Hops     []event
	Actions  []string
}

// revealLimit bounds the payload bytes a reveal shows.
const revealLimit = 64 << 10

func (c *console) task(w http.ResponseWriter, r *http.Request) {
	sh, status, err := c.shardFor(r, true)
	if err != nil {
		c.fail(w, r, status, err)
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		c.fail(w, r, http.StatusBadRequest, fmt.Errorf("task id %q: want a positive number", r.PathValue("id")))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	t, err := ops.GetByID(ctx, sh.db, id)
	if errors.Is(err, outbox.ErrNotFound) {
		c.fail(w, r, http.StatusNotFound, fmt.Errorf("no task %d%s (finished tasks are deleted after their retention)", id, inShard(sh)))
		return
	}
	if err != nil {
		c.failOn(w, r, sh, err)
		return
	}
	now := c.now()
	d := &taskData{Now: now, T: t, Timeline: timeline(t, now), Hops: c.plannedHops(t), Actions: actionsFor(t.State)}
	if r.URL.Query().Get("reveal") == "1" {
		d.Reveal = true
		d.Key = cli.Printable(t.Task.Key)
		p := t.Task.Payload
		if len(p) > revealLimit {
			p, d.Cut = cutText(p, revealLimit), true
		}
		if utf8.Valid(p) {
			d.Payload = string(p)
		} else {
			d.Payload, d.Binary = fmt.Sprintf("% x", p), true
		}
		c.logFor(sh).Info("console: revealed a task's key and payload", "who", who(r), "remote", r.RemoteAddr, "id", t.ID, "topic", t.Task.Topic)
	}
	v := view{Title: fmt.Sprintf("Task %d%s", t.ID, inShard(sh)), Nav: "tasks", Shard: sh.name, Data: d}
	switch r.URL.Query().Get("done") {
	case "cancel":
		v.Flash = "Cancelled."
	case "reschedule":
		v.Flash = "Rescheduled: the relay publishes it again for the new due time."
	case "replay":
		v.Flash = "Replayed: pending again, attempts reset."
	}
	c.render(w, r, "task", http.StatusOK, v)
}

// inShard is " in shard NAME" for a named shard, else "".
func inShard(sh *Shard) string {
	if sh.name == "" {
		return ""
	}
	return " in shard " + sh.name
}

// actionsFor lists the actions a task in state st allows.
func actionsFor(st outbox.State) []string {
	switch st {
	case outbox.StatePending, outbox.StatePublished:
		return []string{"cancel", "reschedule"}
	case outbox.StateDead:
		return []string{"replay", "reschedule", "cancel"}
	}
	return nil
}

// timeline derives a task's history from its row alone: nothing on the
// hot path writes history, so only the latest of each kind of event is
// known, and the page says so.
func timeline(t *ops.Detail, now time.Time) []event {
	ev := []event{{t.CreatedAt, "scheduled: written to the outbox"}}
	if t.Generation > 0 {
		ev = append(ev, event{time.Time{}, fmt.Sprintf("generation %d: rescheduled or replayed %d time(s); a message of an older generation is skipped", t.Generation, t.Generation)})
	}
	// A confirmed publish leaves the claim's owner on the row: only a
	// lease still running is shown.
	if (t.State == outbox.StatePending || t.State == outbox.StatePublished) && t.LeaseOwner != 0 && t.NextAttemptAt.After(now) {
		ev = append(ev, event{time.Time{}, fmt.Sprintf("claimed by a relay or scanner, lease until %s", fmtTime(t.NextAttemptAt))})
	} else if t.State == outbox.StatePending && t.NextAttemptAt.After(now) {
		ev = append(ev, event{t.NextAttemptAt, "next publish attempt (backed off after a failure)"})
	}
	if t.PublishAttempts > 0 {
		ev = append(ev, event{time.Time{}, fmt.Sprintf("%d publish attempt(s) for this generation", t.PublishAttempts)})
	}
	if !t.PublishedAt.IsZero() {
		ev = append(ev, event{t.PublishedAt, "published: handed to the broker (a relay's claim or a rescue)"})
	}
	if t.Rescues > 0 {
		ev = append(ev, event{time.Time{}, fmt.Sprintf("rescued %d time(s): the scanner published it again after it was overdue", t.Rescues)})
	}
	if t.Snoozes > 0 {
		ev = append(ev, event{time.Time{}, fmt.Sprintf("snoozed %d time(s) by its handler; the last error says why", t.Snoozes)})
	}
	due := "due"
	if t.Task.DueAt.After(now) {
		due = "due (in the future)"
	}
	ev = append(ev, event{t.Task.DueAt, due})
	if t.Attempts > 0 {
		ev = append(ev, event{time.Time{}, fmt.Sprintf("delivered: the handler failed and was retried; on attempt %d", t.Attempts)})
	}
	switch t.State {
	case outbox.StateDone:
		ev = append(ev, event{t.DoneAt, fmt.Sprintf("done: handled and committed, %v after due", t.DoneAt.Sub(t.Task.DueAt))})
	case outbox.StateCancelled:
		ev = append(ev, event{t.UpdatedAt, "cancelled"})
	case outbox.StateDead:
		ev = append(ev, event{t.UpdatedAt, "dead: " + shortText(300, t.LastError)})
	}
	if t.LastError != "" && t.State != outbox.StateDead {
		ev = append(ev, event{time.Time{}, "last error: " + shortText(300, t.LastError)})
	}
	return orderEvents(ev)
}

// orderEvents puts timed events in time order; an untimed one stays right
// after the timed event before it (the first event is always timed).
func orderEvents(ev []event) []event {
	type keyed struct {
		at time.Time
		e  event
	}
	ks := make([]keyed, len(ev))
	var at time.Time
	for i, e := range ev {
		if !e.At.IsZero() {
			at = e.At
		}
		ks[i] = keyed{at, e}
	}
	slices.SortStableFunc(ks, func(a, b keyed) int { return a.at.Compare(b.at) })
	for i, k := range ks {
		ev[i] = k.e
	}
	return ev
}

// cutText returns at most n bytes of p, less the start of a UTF-8
// sequence the cut split, so cutting valid text leaves valid text.
func cutText(p []byte, n int) []byte {
	if len(p) <= n {
		return p
	}
	p = p[:n]
	for i := len(p) - 1; i >= 0 && i >= len(p)-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			if !utf8.FullRune(p[i:]) {
				return p[:i]
			}
			break
		}
	}
	return p
}

// plannedHops lists the hops the broker limits in effect plan for a task
// published at its publish time (or now, unpublished) and due at its due
// time: the broker does not report hops, so they are derived, not observed.
func (c *console) plannedHops(t *ops.Detail) []event {
	lim, _, err := brokerLimits(c.env.Broker)
	if err != nil || t.State == outbox.StateDone || t.State == outbox.StateCancelled {
		return nil
	}
	at := t.PublishedAt
	if at.IsZero() {
		at = c.now()
	}
	plan := lim.Plan
	if c.env.Broker.Broker == "rocket" {
		// The RocketMQ publisher's own plan: its last timer hop is a
		// precision short, and the consumer holds the rest.
		plan = func(now, due time.Time) broker.HopPlan { return rocket.PlanHop(lim, now, due) }
	}
	var out []event
	for i := 0; i < 50; i++ {
		h := plan(at, t.Task.DueAt)
		out = append(out, event{at, fmt.Sprintf("hop %d: held by the broker for %s", i+1, fmtDur(h.Delay))})
		at = at.Add(h.Delay)
		if h.Last || h.Delay == 0 {
			break
		}
	}
	if held := t.Task.DueAt.Sub(at); held > 0 && len(out) > 0 {
		out = append(out, event{at, fmt.Sprintf("then held by the consumer until due, up to %s", fmtDur(held))})
	}
	return out
}
