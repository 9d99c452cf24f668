package console

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/redact"
	"github.com/delaybridge/delaybridge/outbox"
	"github.com/delaybridge/delaybridge/rabbit"
	"github.com/delaybridge/delaybridge/rocket"
)

// view is what every page template receives: the layout's fields and the
// page's own Data.
type view struct {
	Title    string
	Nav      string
	Who      string
	ReadOnly bool
	CSRF     string
	Flash    string
	Error    string
	Refresh  int
	// Shard names the shard the page is about, "" on an unsharded console
	// and on the overview; Shards switch to the same page of each shard.
	Shard  string
	Shards []shardLink
	Data   any
}

// parsePages parses each page template with the layout.
func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"when":  fmtTime,
		"ago":   cli.Ago,
		"dur":   fmtDur,
		"short": shortText,
		"add":   func(a, b int) int { return a + b },
		"shard": withShard,
	}
	names, err := fs.Glob(webFiles, "web/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "web/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New(base).Funcs(funcs).ParseFS(webFiles, "web/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		pages[base] = t
	}
	return pages, nil
}

// render writes page with status; the page is rendered into a buffer
// first, so a template error becomes a clean 500.
func (c *console) render(w http.ResponseWriter, r *http.Request, page string, status int, v view) {
	v.Who, v.ReadOnly = who(r), c.readOnly
	v.CSRF = c.csrf.token(who(r))
	if v.Nav == "" {
		v.Nav = page
	}
	if v.Shard != "" && (page == "tasks" || page == "dead") {
		for _, name := range c.shardNames() {
			v.Shards = append(v.Shards, shardLink{Name: name, Href: withShard("/"+page, name), Here: name == v.Shard})
		}
	}
	var buf bytes.Buffer
	if err := c.pages[page].ExecuteTemplate(&buf, "layout", v); err != nil {
		c.log.Error("console: rendering a page failed", "page", page, "err", err)
		http.Error(w, "500 internal error: rendering failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// fail renders err on the error page; bad input is a 400, a missing task a
// 404, anything else a 500 whose cause is logged, not shown.
func (c *console) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	msg := err.Error()
	if status >= 500 {
		c.log.Error("console: request failed", "who", who(r), "path", r.URL.Path, "err", redact.Scrub(err, c.secrets()...))
		msg = "the database could not answer; see the console's log"
	}
	c.render(w, r, "error", status, view{Title: http.StatusText(status), Nav: "none", Error: msg})
}

// failOn is fail for an error of shard sh's database: a 500 that names the
// shard.
func (c *console) failOn(w http.ResponseWriter, r *http.Request, sh *Shard, err error) {
	if sh.name == "" {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	c.logFor(sh).Error("console: request failed", "who", who(r), "path", r.URL.Path, "err", sh.describe(err))
	c.render(w, r, "error", http.StatusInternalServerError, view{Title: http.StatusText(http.StatusInternalServerError), Nav: "none",
		Error: fmt.Sprintf("shard %s: its database could not answer; see the console's log", sh.name)})
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// fmtWhen writes t as cli.ParseWhen reads it back exactly: RFC 3339 in UTC to
// the millisecond, the precision the outbox keeps (and fmtTime shows).
func fmtWhen(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

func fmtDur(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	if d >= 48*time.Hour && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return d.String()
}

// shortText cuts s to n runes and makes it printable.
func shortText(n int, s string) string {
	s = cli.Printable(s)
	if utf8.RuneCountInString(s) > n {
		r := []rune(s)
		s = string(r[:n]) + "…"
	}
	return s
}

// ---------------------------------------------------------------- overview

// backlogRow is one topic's unfinished tasks.
type backlogRow struct {
	Topic                    string
	Pending, Published, Dead int
}

type overviewData struct {
	Now       time.Time
	Stats     *outbox.Stats
	Grace     time.Duration
	Backlog   []backlogRow
	Due       barChart
	DueTotal  int
	Lateness  lineChart
	LateRows  []latenessRow
	RescDone  outbox.RescueSample
	RescPub   outbox.RescueSample
	HasCounts bool
	// Signals say what is stuck for want of a process, as status says
	// it: NO CONSUMER, NO RELAY, RELAY BEHIND, TOPOLOGY MISMATCH.
	Signals []string
}

type latenessRow struct {
	From, To time.Time
	L        outbox.Lateness
}

// overviewBuckets splits the hour ahead and the hour behind into 5-minute
// buckets.
const overviewBuckets = 12

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
		d, err := c.overviewData(ctx, c.shards[0].db, now)
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
			d, err := c.overviewData(ctx, sh.db, now)
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

func (c *console) overviewData(ctx context.Context, db outbox.Querier, now time.Time) (*overviewData, error) {
	st, err := outbox.ReadStats(ctx, db, now, c.grace, time.Hour)
	if err != nil {
		return nil, err
	}
	d := &overviewData{Now: now, Stats: st, Grace: c.grace, HasCounts: !st.CountsAt.IsZero()}
	if d.Signals, err = c.env.Signals(ctx, db, st, now, c.grace); err != nil {
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

	due, err := outbox.DueCounts(ctx, db, now, time.Hour, overviewBuckets)
	if err != nil {
		return nil, err
	}
	for _, n := range due {
		d.DueTotal += n
	}
	d.Due = newBarChart(due, func(i int) string { return fmt.Sprintf("+%dm", i*60/overviewBuckets) })
	late, err := outbox.LatenessSeries(ctx, db, now, time.Hour, overviewBuckets)
	if err != nil {
		return nil, err
	}
	width := time.Hour / overviewBuckets
	for i, l := range late {
		from := now.Add(-time.Hour + time.Duration(i)*width)
		d.LateRows = append(d.LateRows, latenessRow{From: from, To: from.Add(width), L: l})
	}
	d.Lateness = newLatenessChart(late, func(i int) string { return fmt.Sprintf("-%dm", 60-i*60/overviewBuckets) })
	if d.RescDone, d.RescPub, err = outbox.Rescues(ctx, db, now, time.Hour); err != nil {
		return nil, err
	}
	return d, nil
}

// ---------------------------------------------------------------- search

type tasksData struct {
	Now    time.Time
	Form   url.Values
	States []outbox.State
	Page   *outbox.SearchPage
	Next   string
}

// parseWindowEdge reads a due-window edge: empty, RFC 3339, or a duration
// from now with a sign (+1h, -30m).
func parseWindowEdge(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if rest, ok := strings.CutPrefix(s, "-"); ok {
		d, err := time.ParseDuration(rest)
		if err != nil || d < 0 {
			return time.Time{}, fmt.Errorf("bad duration %q: want RFC 3339, +duration or -duration", s)
		}
		return now.Add(-d), nil
	}
	return cli.ParseWhen(s, now)
}

func (c *console) tasks(w http.ResponseWriter, r *http.Request) {
	sh, status, err := c.shardFor(r, false)
	if err != nil {
		c.fail(w, r, status, err)
		return
	}
	now := c.now()
	q := r.URL.Query()
	d := &tasksData{Now: now, Form: q, States: outbox.States}
	s := outbox.SearchQuery{Topic: strings.TrimSpace(q.Get("topic")), KeyPrefix: q.Get("key"), State: outbox.State(q.Get("state"))}
	if after := q.Get("after"); after != "" {
		s.After, err = c.csrf.openCursor(after)
	}
	if err == nil {
		s.DueFrom, err = parseWindowEdge(q.Get("from"), now)
	}
	if err == nil {
		s.DueTo, err = parseWindowEdge(q.Get("to"), now)
	}
	if err == nil && s.Topic != "" {
		err = broker.ValidateTopic(s.Topic)
	}
	if err != nil {
		c.render(w, r, "tasks", http.StatusBadRequest, view{Title: "Tasks", Error: err.Error(), Shard: sh.name, Data: d})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	page, err := outbox.Search(ctx, sh.db, s)
	if errors.Is(err, outbox.ErrBadSearch) {
		c.render(w, r, "tasks", http.StatusBadRequest, view{Title: "Tasks", Error: err.Error(), Shard: sh.name, Data: d})
		return
	}
	if err != nil {
		c.failOn(w, r, sh, err)
		return
	}
	d.Page = page
	if page.Next != "" {
		next := url.Values{}
		for k, v := range q {
			next[k] = v
		}
		next.Set("after", c.csrf.sealCursor(page.Next))
		if sh.name != "" {
			next.Set("shard", sh.name)
		}
		d.Next = "/tasks?" + next.Encode()
	}
	c.render(w, r, "tasks", http.StatusOK, view{Title: "Tasks", Shard: sh.name, Data: d})
}

// ---------------------------------------------------------------- one task

type event struct {
	At   time.Time
	What string
}

type taskData struct {
	Now      time.Time
	T        *outbox.Detail
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
	t, err := outbox.GetByID(ctx, sh.db, id)
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
func timeline(t *outbox.Detail, now time.Time) []event {
	ev := []event{{t.CreatedAt, "scheduled: written to the outbox"}}
	if t.Generation > 0 {
		ev = append(ev, event{time.Time{}, fmt.Sprintf("generation %d: rescheduled or replayed %d time(s); a message of an older generation is skipped", t.Generation, t.Generation)})
	}
	if t.State == outbox.StatePending && t.LeaseOwner != 0 {
		ev = append(ev, event{time.Time{}, fmt.Sprintf("claimed by a relay or scanner, lease until %s", fmtTime(t.NextAttemptAt))})
	} else if t.State == outbox.StatePending && t.NextAttemptAt.After(now) {
		ev = append(ev, event{t.NextAttemptAt, "next publish attempt (backed off after a failure)"})
	}
	if t.PublishAttempts > 0 {
		ev = append(ev, event{time.Time{}, fmt.Sprintf("%d publish attempt(s) for this generation", t.PublishAttempts)})
	}
	if !t.PublishedAt.IsZero() {
		ev = append(ev, event{t.PublishedAt, "published: the broker confirmed the message"})
	}
	if t.Rescues > 0 {
		ev = append(ev, event{time.Time{}, fmt.Sprintf("rescued %d time(s): the scanner published it again after it was overdue", t.Rescues)})
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
func (c *console) plannedHops(t *outbox.Detail) []event {
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

// confirmData is the confirmation page of an action.
type confirmData struct {
	Action string
	Target string
	Fields map[string][]string
	Count  int
	Back   string
}

// taskAction cancels, reschedules or replays one task: the first POST
// shows a confirmation, the second (confirm=yes) acts, logs and redirects
// to the task's page.
func (c *console) taskAction(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	if !slices.Contains([]string{"cancel", "reschedule", "replay"}, action) {
		http.NotFound(w, r)
		return
	}
	if c.readOnly {
		c.log.Warn("console: refused an action in read-only mode", "who", who(r), "remote", r.RemoteAddr, "action", action, "id", r.PathValue("id"), "shard", r.URL.Query().Get("shard"))
		c.fail(w, r, http.StatusForbidden, errors.New("this console is read-only (--read-only): no task can be changed from it"))
		return
	}
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
	now := c.now()
	var due time.Time
	if action == "reschedule" {
		if due, err = cli.ParseWhen(r.PostForm.Get("when"), now); err != nil {
			c.fail(w, r, http.StatusBadRequest, fmt.Errorf("reschedule: %w", err))
			return
		}
	}
	if r.PostForm.Get("confirm") != "yes" {
		target := fmt.Sprintf("task %d%s", id, inShard(sh))
		fields := map[string][]string{}
		if action == "reschedule" {
			target += " to " + fmtTime(due)
			// The confirmation carries the absolute time it shows, not
			// what was typed: "+30m" parsed again on confirm would land
			// as much later as the operator took to confirm.
			fields["when"] = []string{fmtWhen(due)}
		}
		c.render(w, r, "confirm", http.StatusOK, view{Title: "Confirm", Nav: "tasks", Shard: sh.name, Data: confirmData{
			Action: action, Target: target, Count: 1, Back: withShard(fmt.Sprintf("/tasks/%d", id), sh.name),
			Fields: fields,
		}})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	topic, err := actOn(ctx, sh.db, id, func(ctx context.Context, q outbox.Querier, topic, key string) error {
		switch action {
		case "cancel":
			return outbox.Cancel(ctx, q, topic, key)
		case "reschedule":
			return outbox.Reschedule(ctx, q, topic, key, due)
		default:
			return outbox.Replay(ctx, q, topic, key)
		}
	})
	log := c.logFor(sh).With("who", who(r), "remote", r.RemoteAddr, "action", action, "id", id, "topic", topic)
	if action == "reschedule" {
		log = log.With("due", due.UTC())
	}
	if err != nil {
		log.Warn("console: action failed", "err", redact.Scrub(err, c.secrets()...))
		// The outbox's errors name the key; the page says why without it.
		in := inShard(sh)
		switch {
		case errors.Is(err, outbox.ErrNotFound):
			c.fail(w, r, http.StatusNotFound, fmt.Errorf("cannot %s task %d%s: it no longer exists", action, id, in))
		case errors.Is(err, outbox.ErrFinished):
			c.fail(w, r, http.StatusConflict, fmt.Errorf("cannot %s task %d%s: it is already done or cancelled", action, id, in))
		case errors.Is(err, outbox.ErrInvalidDue), errors.Is(err, broker.ErrTooFar):
			c.fail(w, r, http.StatusBadRequest, fmt.Errorf("cannot %s task %d%s: %w", action, id, in, err))
		case errors.Is(err, outbox.ErrNotDead):
			c.fail(w, r, http.StatusConflict, fmt.Errorf("cannot replay task %d%s: it is not dead", id, in))
		default:
			c.failOn(w, r, sh, err)
		}
		return
	}
	log.Info("console: action done")
	http.Redirect(w, r, withShard(fmt.Sprintf("/tasks/%d?done=%s", id, action), sh.name), http.StatusSeeOther)
}

// actOn runs fn on task id of db inside a transaction that locks the row
// first, so the action hits exactly the row shown, and returns its topic.
func actOn(ctx context.Context, db *sql.DB, id int64, fn func(ctx context.Context, q outbox.Querier, topic, key string) error) (string, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	topic, key, err := outbox.LockByID(ctx, tx, id)
	if err != nil {
		return "", err
	}
	if err := fn(ctx, tx, topic, key); err != nil {
		return topic, keyless{err: err, topic: topic, key: key}
	}
	return topic, tx.Commit()
}

// keyless is an outbox error whose text names the task by topic and id
// rather than by key (the outbox's errors say topic/key): the console's
// logs carry ids and topics, never keys. errors.Is and As see the
// outbox's error.
type keyless struct {
	err        error
	topic, key string
}

func (k keyless) Error() string {
	return strings.ReplaceAll(k.err.Error(), k.topic+"/"+k.key, k.topic+"/(key hidden)")
}

func (k keyless) Unwrap() error { return k.err }

// ---------------------------------------------------------------- dead tasks

type deadData struct {
	Now time.Time
	// Dead is the background count's total; Counted is false when there
	// has been none yet (no delaybridge run counted this database).
	Dead    int
	Counted bool
	// Shard is the shard shown, "" on an unsharded console.
	Shard string
	Page  *outbox.SearchPage
	Next  string
}

func (c *console) dead(w http.ResponseWriter, r *http.Request) {
	sh, status, err := c.shardFor(r, false)
	if err != nil {
		c.fail(w, r, status, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	var after string
	if a := r.URL.Query().Get("after"); a != "" {
		if after, err = c.csrf.openCursor(a); err != nil {
			c.fail(w, r, http.StatusBadRequest, err)
			return
		}
	}
	page, err := outbox.Search(ctx, sh.db, outbox.SearchQuery{State: outbox.StateDead, After: after, Limit: 100})
	if errors.Is(err, outbox.ErrBadSearch) {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if err != nil {
		c.failOn(w, r, sh, err)
		return
	}
	st, err := outbox.ReadStats(ctx, sh.db, c.now(), c.grace, 0)
	if err != nil {
		c.failOn(w, r, sh, err)
		return
	}
	d := &deadData{Now: c.now(), Dead: st.Dead, Counted: !st.CountsAt.IsZero(), Shard: sh.name, Page: page}
	if page.Next != "" {
		d.Next = withShard("/dead?"+url.Values{"after": {c.csrf.sealCursor(page.Next)}}.Encode(), sh.name)
	}
	v := view{Title: "Dead tasks", Shard: sh.name, Data: d}
	// The counts come back in the redirect's URL: only numbers are shown,
	// so a crafted link cannot put its own words in the console's banner.
	if n, err := strconv.Atoi(r.URL.Query().Get("replayed")); err == nil && n >= 0 {
		v.Flash = fmt.Sprintf("Replayed %d task(s): pending again.", n)
		if f, err := strconv.Atoi(r.URL.Query().Get("failed")); err == nil && f > 0 {
			v.Error = fmt.Sprintf("%d task(s) could not be replayed (no longer dead); see the console's log.", f)
		}
	}
	c.render(w, r, "dead", http.StatusOK, v)
}

// maxReplay bounds the tasks one replay request names: a page of the dead
// list.
const maxReplay = 100

func (c *console) deadReplay(w http.ResponseWriter, r *http.Request) {
	if c.readOnly {
		c.log.Warn("console: refused an action in read-only mode", "who", who(r), "remote", r.RemoteAddr, "action", "replay", "shard", r.URL.Query().Get("shard"))
		c.fail(w, r, http.StatusForbidden, errors.New("this console is read-only (--read-only): no task can be changed from it"))
		return
	}
	sh, status, err := c.shardFor(r, true)
	if err != nil {
		c.fail(w, r, status, err)
		return
	}
	var ids []int64
	for _, s := range r.PostForm["id"] {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id <= 0 {
			c.fail(w, r, http.StatusBadRequest, fmt.Errorf("task id %q: want a positive number", s))
			return
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	switch {
	case len(ids) == 0:
		c.fail(w, r, http.StatusBadRequest, errors.New("no task selected: tick the tasks to replay"))
		return
	case len(ids) > maxReplay:
		c.fail(w, r, http.StatusBadRequest, fmt.Errorf("%d tasks selected: at most %d at a time", len(ids), maxReplay))
		return
	}
	if r.PostForm.Get("confirm") != "yes" {
		c.render(w, r, "confirm", http.StatusOK, view{Title: "Confirm", Nav: "dead", Shard: sh.name, Data: confirmData{
			Action: "replay", Target: fmt.Sprintf("%d dead task(s)%s", len(ids), inShard(sh)), Count: len(ids), Back: withShard("/dead", sh.name),
			Fields: map[string][]string{"id": r.PostForm["id"]},
		}})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	replayed, failed := 0, 0
	for _, id := range ids {
		topic, err := actOn(ctx, sh.db, id, func(ctx context.Context, q outbox.Querier, topic, key string) error {
			return outbox.Replay(ctx, q, topic, key)
		})
		log := c.logFor(sh).With("who", who(r), "remote", r.RemoteAddr, "action", "replay", "id", id, "topic", topic)
		if err != nil {
			failed++
			log.Warn("console: action failed", "err", redact.Scrub(err, c.secrets()...))
			continue
		}
		replayed++
		log.Info("console: action done")
	}
	http.Redirect(w, r, withShard(fmt.Sprintf("/dead?replayed=%d&failed=%d", replayed, failed), sh.name), http.StatusSeeOther)
}

// ---------------------------------------------------------------- brokers

type limitRow struct{ Name, Value string }

type brokersData struct {
	Kind   string
	Mode   string
	Limits []limitRow
	Err    string
	Doctor doctorRun
}

// brokerLimits returns the delay limits the broker settings bf put in
// effect, as the adapters compute them, and the rows the brokers page
// shows.
func brokerLimits(bf delaybridge.Config) (broker.Limits, []limitRow, error) {
	var rows []limitRow
	switch bf.Broker {
	case "rabbit":
		cfg, err := bf.RabbitConfig()
		if err != nil {
			return broker.Limits{}, nil, err
		}
		lim, err := cfg.Limits()
		if err != nil {
			return broker.Limits{}, nil, err
		}
		if cfg.Mode == rabbit.ModeDelayedExchange {
			rows = append(rows, limitRow{"plugin", "rabbitmq_delayed_message_exchange (x-delay header)"},
				limitRow{"max delay per hop", fmtDur(lim.MaxHop)}, limitRow{"precision", "the plugin's timer"})
			return lim, rows, nil
		}
		unit, depth := cfg.Unit, cfg.Depth
		if unit <= 0 {
			unit = rabbit.DefaultUnit
		}
		if depth <= 0 {
			depth = rabbit.DefaultDepth
		}
		rows = append(rows, limitRow{"plugin", "none (ladder of quorum queues)"},
			limitRow{"ladder", fmt.Sprintf("prefix %q, unit %v, depth %d", cfg.Prefix, unit, depth)},
			limitRow{"max delay per hop", fmtDur(lim.MaxHop)},
			limitRow{"precision", fmt.Sprintf("%v (unit + %v release lead; early arrivals are held)", lim.Precision, lim.Precision-unit)},
			limitRow{"queue bound", fmt.Sprintf("x-max-length %d", bf.RabbitMaxLength)})
		return lim, rows, nil
	case "rocket":
		cfg, err := bf.RocketConfig()
		if err != nil {
			return broker.Limits{}, nil, err
		}
		lim := cfg.Limits
		rows = append(rows, limitRow{"name servers", strings.Join(cfg.NameServers, ", ")},
			limitRow{"max delay per hop", fmtDur(lim.MaxHop)}, limitRow{"precision", fmtDur(lim.Precision)})
		if len(lim.Levels) > 0 {
			lv := make([]string, len(lim.Levels))
			for i, l := range lim.Levels {
				lv[i] = l.String()
			}
			rows = append(rows, limitRow{"delay levels", strings.Join(lv, " ")})
		}
		return lim, rows, nil
	}
	return broker.Limits{}, nil, fmt.Errorf("--broker %q: want rabbit or rocket", bf.Broker)
}

func (c *console) brokers(w http.ResponseWriter, r *http.Request) {
	d := &brokersData{Kind: c.env.Broker.Broker, Mode: c.env.Broker.Mode(), Doctor: c.lastDoctor()}
	if _, rows, err := brokerLimits(c.env.Broker); err != nil {
		d.Err = err.Error()
	} else {
		d.Limits = rows
	}
	v := view{Title: "Brokers", Data: d}
	if d.Doctor.Running {
		v.Refresh = 2
	}
	c.render(w, r, "brokers", http.StatusOK, v)
}

// brokersCheck starts doctor's checks. They change no task (they probe the
// database and the broker), so a read-only console runs them too.
func (c *console) brokersCheck(w http.ResponseWriter, r *http.Request) {
	if c.startDoctor(who(r)) {
		c.log.Info("console: doctor started", "who", who(r), "remote", r.RemoteAddr)
	}
	http.Redirect(w, r, "/brokers", http.StatusSeeOther)
}
