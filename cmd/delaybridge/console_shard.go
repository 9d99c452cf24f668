package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// A sharded outbox keeps one delay_task table per shard database (see
// shard.go). The console serves them all from one process: the overview
// reads every shard at once and shows each under its name, and every other
// page works on one shard, named by ?shard=NAME in its URL, since task ids
// are only unique within a shard.

// consoleShard is one outbox database the console serves.
type consoleShard struct {
	// name is the --shard name; "" for the one database of an unsharded
	// console.
	name string
	dsn  string
	db   *sql.DB
}

// describe says why sh could not answer, naming its database with the
// password hidden.
func (sh *consoleShard) describe(err error) string {
	return fmt.Sprintf("database %s: %v", redactDSN(sh.dsn), scrub(err, sh.dsn))
}

// shardPingTimeout bounds the check at start that each shard answers.
const shardPingTimeout = 5 * time.Second

// openConsoleShards opens the databases the console serves: --mysql-dsn
// when no --shard is given, which must answer at start as for every other
// command; else every --shard, each a pool that connects when used. A shard
// that does not answer at start is logged, and shown as down until it
// answers: the console is for looking at an outage too.
func (a *app) openConsoleShards(ctx context.Context, sf *shardFlags) ([]*consoleShard, error) {
	parsed, err := sf.parse()
	if err != nil {
		return nil, err
	}
	if len(parsed) == 0 {
		db, err := a.openDB(ctx)
		if err != nil {
			return nil, err
		}
		return []*consoleShard{{dsn: a.mysqlDSN, db: db}}, nil
	}
	if a.mysqlDSN != "" {
		return nil, fmt.Errorf("--mysql-dsn and --shard are both set (flag, %s or config file): give every outbox as a --shard", envName("mysql-dsn"))
	}
	// mysqlConfig reads a.mysqlDSN: point it at each shard in turn, so the
	// --mysql-tls-* flags apply to every shard as they do for status.
	defer func() { a.mysqlDSN = "" }()
	var out []*consoleShard
	for _, p := range parsed {
		a.mysqlDSN = p.dsn
		db, err := openPool(a)
		if err != nil {
			closeShards(out)
			return nil, fmt.Errorf("--shard %s: %w", p.name, scrub(err, p.dsn))
		}
		out = append(out, &consoleShard{name: p.name, dsn: p.dsn, db: db})
	}
	for _, sh := range out {
		pctx, cancel := context.WithTimeout(ctx, shardPingTimeout)
		if err := sh.db.PingContext(pctx); err != nil {
			a.log.Warn("delaybridge console: a shard does not answer; it is shown as down until it does", "shard", sh.name, "err", sh.describe(err))
		}
		cancel()
	}
	return out, nil
}

// openPool opens a pool on a.mysqlDSN without connecting.
func openPool(a *app) (*sql.DB, error) {
	cfg, err := a.mysqlConfig()
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(conn), nil
}

func closeShards(shards []*consoleShard) {
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
func (c *console) shardFor(r *http.Request, need bool) (*consoleShard, int, error) {
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
func (c *console) logFor(sh *consoleShard) *slog.Logger {
	if sh.name == "" {
		return c.log
	}
	return c.log.With("shard", sh.name)
}

// secrets are the DSNs an error must never show.
func (c *console) secrets() []string {
	out := []string{c.a.mysqlDSN}
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
