package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/redact"
)

type deadData struct {
	Now time.Time
	// Dead is the background count's total; Counted is false when there
	// has been none yet (no delaybridge run counted this database).
	Dead    int
	Counted bool
	// Shard is the shard shown, "" on an unsharded console.
	Shard string
	Page  *ops.SearchPage
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
	page, err := ops.Search(ctx, sh.db, ops.SearchQuery{State: outbox.StateDead, After: after, Limit: 100})
	if errors.Is(err, ops.ErrBadSearch) {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if err != nil {
		c.failOn(w, r, sh, err)
		return
	}
	st, err := ops.ReadStats(ctx, sh.db, c.now(), c.grace, 0)
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
