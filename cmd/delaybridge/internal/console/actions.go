package console

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/redact"
)

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
	topic, key, err := ops.LockByID(ctx, tx, id)
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
