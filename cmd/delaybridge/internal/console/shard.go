package console

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/redact"
)

// A sharded outbox keeps one delay_task table per shard database (see
// shard.go). The console serves them all from one process: the overview
// reads every shard at once and shows each under its name, and every other
// page works on one shard, named by ?shard=NAME in its URL, since task ids
// are only unique within a shard.

// Shard is one outbox database the console serves.
type Shard struct {
	// name is the --shard name; "" for the one database of an unsharded
	// console.
	name string
	dsn  string
	db   *sql.DB
}

// describe says why sh could not answer, naming its database with the
// password hidden.
func (sh *Shard) describe(err error) string {
	return fmt.Sprintf("database %s: %v", redact.DSN(sh.dsn), redact.Scrub(err, sh.dsn))
}

// shardPingTimeout bounds the check at start that each shard answers.
const shardPingTimeout = 5 * time.Second

// NewShard is the outbox database db, at dsn, that the console serves as
// shard name ("" for the one database of an unsharded console).
func NewShard(name, dsn string, db *sql.DB) *Shard { return &Shard{name: name, dsn: dsn, db: db} }

// pingShards logs each named shard that does not answer at start: it is
// shown as down until it answers, since the console is for looking at an
// outage too.
func pingShards(ctx context.Context, log *slog.Logger, shards []*Shard) {
	for _, sh := range shards {
		if sh.name == "" {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, shardPingTimeout)
		if err := sh.db.PingContext(pctx); err != nil {
			log.Warn("delaybridge console: a shard does not answer; it is shown as down until it does", "shard", sh.name, "err", sh.describe(err))
		}
		cancel()
	}
}

// CloseShards closes the shards' databases.
func CloseShards(shards []*Shard) {
	for _, sh := range shards {
		_ = sh.db.Close()
	}
}

// sharded reports whether the console serves named shards.
func (c *console) sharded() bool { return c.shards[0].name != "" }

// shardNames lists the shards' names, nil for an unsharded console.
func (c *console) shardNames() []string {
	if !c.sharded() {
		return nil
	}
	names := make([]string, len(c.shards))
	for i, sh := range c.shards {
		names[i] = sh.name
	}
	return names
}

// shardFor returns the shard r names with ?shard=NAME. Without one, an
// unsharded console has its one database; a sharded one its first shard,
// unless need says the request only makes sense on a named shard (a task
// id, an action). The status says how to answer an error.
func (c *console) shardFor(r *http.Request, need bool) (*Shard, int, error) {
	name := r.URL.Query().Get("shard")
	if !c.sharded() {
		if name != "" {
			return nil, http.StatusNotFound, fmt.Errorf("no shard %q: this console serves one outbox database, not shards", shortText(64, name))
		}
		return c.shards[0], 0, nil
	}
	if name == "" {
		if need {
			return nil, http.StatusBadRequest, fmt.Errorf("which shard? Task ids are per shard: add ?shard=NAME, one of %s", strings.Join(c.shardNames(), ", "))
		}
		return c.shards[0], 0, nil
	}
	for _, sh := range c.shards {
		if sh.name == name {
			return sh, 0, nil
		}
	}
	return nil, http.StatusNotFound, fmt.Errorf("no shard %q: this console serves %s", shortText(64, name), strings.Join(c.shardNames(), ", "))
}

// logFor is the console's logger, naming sh when the outbox is sharded.
func (c *console) logFor(sh *Shard) *slog.Logger {
	if sh.name == "" {
		return c.log
	}
	return c.log.With("shard", sh.name)
}

// secrets are the DSNs an error must never show.
func (c *console) secrets() []string {
	out := []string{c.env.DSN}
	for _, sh := range c.shards {
		out = append(out, sh.dsn)
	}
	return out
}

// withShard adds ?shard=NAME (or &shard=NAME) to path; an empty name
// leaves path as it is.
func withShard(path, name string) string {
	if name == "" {
		return path
	}
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return path + sep + url.Values{"shard": {name}}.Encode()
}

// shardLink is one entry of the shard switcher of the search and dead
// pages.
type shardLink struct {
	Name string
	Href string
	Here bool
}
