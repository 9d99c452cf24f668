package console

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// backlogRow is one topic's unfinished tasks.
type backlogRow struct {
	Topic                    string
	Pending, Published, Dead int
}

type overviewData struct {
	Now      time.Time
	Stats    *ops.Stats
	Grace    time.Duration
	Backlog  []backlogRow
	Due      barChart
	DueTotal int
	// DueCapped: a bucket of Due reached dueCap, so DueTotal is a floor.
	DueCapped bool
	Lateness  lineChart
	LateRows  []latenessRow
	RescDone  ops.RescueSample
	RescPub   ops.RescueSample
	HasCounts bool
	// Signals say what is stuck for want of a process, as status says
	// it: NO CONSUMER, NO RELAY, RELAY BEHIND, TOPOLOGY MISMATCH.
	Signals []string
}

type latenessRow struct {
	From, To time.Time
	L        ops.Lateness
}

// overviewBuckets splits the hour ahead and the hour behind into 5-minute
// buckets.
const overviewBuckets = 12

// dueCap bounds what the overview counts of a state due in one bucket: it
// reads at most 2 × 12 × dueCap index entries, however many tasks wait, and
// shows the total as "at least".
const dueCap = 5000

// shardOverview is one shard's part of the overview.
type shardOverview struct {
	// Name is the shard's name, "" on an unsharded console.
	Name string
	// ID prefixes the ids of the section's elements: "" unsharded, else
	// "shard-NAME-".
	ID string
	// Err says why the shard could not be read; D is nil then.
	Err string
	D   *overviewData
}

// overviewTotals adds up the shards that answered.
type overviewTotals struct {
	Dead, Overdue, DueTotal, Done, Cancelled int
	DueCapped                                bool
	OldestPendingDue                         time.Time
	OldestShard                              string
	Backlog                                  []backlogRow
	Up, Down                                 int
	// Uncounted lists the shards that answered but have no background
	// count yet: their backlog is missing from the totals.
	Uncounted []string
}

type overviewPage struct {
	Now     time.Time
	Sharded bool
	Shards  []shardOverview
	Total   overviewTotals
}

// overviewTimeout bounds each shard's part of the overview; the shards are
// read at once, so a shard that hangs delays the page by this at most.
const overviewTimeout = 10 * time.Second

func (c *console) overview(w http.ResponseWriter, r *http.Request) {
	now := c.now()
	if !c.sharded() {
		ctx, cancel := context.WithTimeout(r.Context(), overviewTimeout)
		defer cancel()
		d, err := readOverview(ctx, c.shards[0].db, now, c.grace)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, err)
			return
		}
		c.render(w, r, "overview", http.StatusOK, view{Title: "Overview", Data: &overviewPage{Now: now, Shards: []shardOverview{{D: d}}}, Refresh: 30})
		return
	}
	p := &overviewPage{Now: now, Sharded: true, Shards: make([]shardOverview, len(c.shards))}
	var wg sync.WaitGroup
	for i, sh := range c.shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(r.Context(), overviewTimeout)
			defer cancel()
			so := shardOverview{Name: sh.name, ID: "shard-" + sh.name + "-"}
			d, err := readOverview(ctx, sh.db, now, c.grace)
			if err != nil {
				so.Err = sh.describe(err)
				c.logFor(sh).Warn("console: a shard could not be read for the overview", "who", who(r), "err", so.Err)
			} else {
				so.D = d
			}
			p.Shards[i] = so
		}()
	}
	wg.Wait()
	p.Total = overviewTotal(p.Shards)
	c.render(w, r, "overview", http.StatusOK, view{Title: "Overview", Data: p, Refresh: 30})
}

// overviewTotal adds up the figures of the shards that answered.
func overviewTotal(shards []shardOverview) overviewTotals {
	var t overviewTotals
	topics := map[string]*backlogRow{}
	for _, so := range shards {
		if so.D == nil {
			t.Down++
			continue
		}
		t.Up++
		st := so.D.Stats
		t.Overdue += st.Overdue
		t.DueTotal += so.D.DueTotal
		t.DueCapped = t.DueCapped || so.D.DueCapped
		if !st.OldestPendingDue.IsZero() && (t.OldestPendingDue.IsZero() || st.OldestPendingDue.Before(t.OldestPendingDue)) {
			t.OldestPendingDue, t.OldestShard = st.OldestPendingDue, so.Name
		}
		if !so.D.HasCounts {
			t.Uncounted = append(t.Uncounted, so.Name)
			continue
		}
		t.Dead += st.Dead
		t.Done += st.Done
		t.Cancelled += st.Cancelled
		for _, b := range so.D.Backlog {
			row := topics[b.Topic]
			if row == nil {
				row = &backlogRow{Topic: b.Topic}
				topics[b.Topic] = row
			}
			row.Pending += b.Pending
			row.Published += b.Published
			row.Dead += b.Dead
		}
	}
	for _, row := range topics {
		t.Backlog = append(t.Backlog, *row)
	}
	slices.SortFunc(t.Backlog, func(a, b backlogRow) int { return strings.Compare(a.Topic, b.Topic) })
	return t
}

// TimeOverview reads what the console's overview shows of db, as a request
// for it would, and returns how long that took: soak times it at the peak.
func TimeOverview(ctx context.Context, db *sql.DB, grace time.Duration) (time.Duration, error) {
	start := time.Now()
	_, err := readOverview(ctx, db, start, grace)
	return time.Since(start), err
}

// readOverview reads the overview of one database. Its four parts (the
// figures and signals, what falls due, the lateness, the rescues) are read
// at once, on connections of their own: each walks a bounded range of an
// index, and the page waits for the longest, not for their sum.
func readOverview(ctx context.Context, db *sql.DB, now time.Time, grace time.Duration) (*overviewData, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg                       sync.WaitGroup
		due                      []int
		capped                   bool
		late                     []ops.Lateness
		rescDone, rescPub        ops.RescueSample
		dueErr, lateErr, rescErr error
	)
	wg.Add(3)
	go func() {
		defer wg.Done()
		due, capped, dueErr = ops.DueCounts(ctx, db, now, time.Hour, overviewBuckets, dueCap)
	}()
	go func() {
		defer wg.Done()
		late, lateErr = ops.LatenessSeries(ctx, db, now, time.Hour, overviewBuckets)
	}()
	go func() {
		defer wg.Done()
		rescDone, rescPub, rescErr = ops.Rescues(ctx, db, now, time.Hour)
	}()
	d, err := readFigures(ctx, db, now, grace)
	if err != nil {
		cancel()
	}
	wg.Wait()
	if err := errors.Join(err, dueErr, lateErr, rescErr); err != nil {
		return nil, err
	}
	d.RescDone, d.RescPub = rescDone, rescPub
	d.DueCapped = capped
	for _, n := range due {
		d.DueTotal += n
	}
	d.Due = newBarChart(due, func(i int) string { return fmt.Sprintf("+%dm", i*60/overviewBuckets) })
	width := time.Hour / overviewBuckets
	for i, l := range late {
		from := now.Add(-time.Hour + time.Duration(i)*width)
		d.LateRows = append(d.LateRows, latenessRow{From: from, To: from.Add(width), L: l})
	}
	d.Lateness = newLatenessChart(late, func(i int) string { return fmt.Sprintf("-%dm", 60-i*60/overviewBuckets) })
	return d, nil
}

// readFigures reads the overview's figures, signals and backlog by topic.
func readFigures(ctx context.Context, db outbox.Querier, now time.Time, grace time.Duration) (*overviewData, error) {
	st, err := ops.ReadStats(ctx, db, now, grace, time.Hour)
	if err != nil {
		return nil, err
	}
	d := &overviewData{Now: now, Stats: st, Grace: grace, HasCounts: !st.CountsAt.IsZero()}
	if d.Signals, err = cli.Signals(ctx, db, st, now, grace); err != nil {
		return nil, err
	}
	topics := map[string]*backlogRow{}
	for state, byTopic := range st.Backlog {
		for t, n := range byTopic {
			row := topics[t]
			if row == nil {
				row = &backlogRow{Topic: t}
				topics[t] = row
			}
			switch state {
			case outbox.StatePending:
				row.Pending = n
			case outbox.StatePublished:
				row.Published = n
			case outbox.StateDead:
				row.Dead = n
			}
		}
	}
	for _, row := range topics {
		d.Backlog = append(d.Backlog, *row)
	}
	slices.SortFunc(d.Backlog, func(a, b backlogRow) int { return strings.Compare(a.Topic, b.Topic) })
	return d, nil
}
