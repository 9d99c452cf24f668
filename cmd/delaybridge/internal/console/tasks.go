package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

type tasksData struct {
	Now    time.Time
	Form   url.Values
	States []outbox.State
	Page   *ops.SearchPage
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
	d := &tasksData{Now: now, Form: q, States: ops.States}
	s := ops.SearchQuery{Topic: strings.TrimSpace(q.Get("topic")), KeyPrefix: q.Get("key"), State: outbox.State(q.Get("state"))}
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
	page, err := ops.Search(ctx, sh.db, s)
	if errors.Is(err, ops.ErrBadSearch) {
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
