package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/store"
)

// Role is what a process does with the outbox, as its presence records it.
type Role string

// Roles a presence may have.
const (
	// RoleRelay: publishes tasks (delaybridge run: relay and scanner).
	RoleRelay Role = "relay"
	// RoleConsumer: consumes topics and handles their tasks.
	RoleConsumer Role = "consumer"
)

// ErrTopologyMismatch is returned by Announce when a consumer's broker
// topology differs from that of a live relay or consumer of the same
// outbox; the error names each setting with both values.
var ErrTopologyMismatch = errors.New("outbox: broker topology differs from another live process's")

// Presence is one process's record in delaybridge_presence (migration 5).
type Presence struct {
	// Instance names the process uniquely; Announce fills in
	// host:pid:random when it is empty.
	Instance string `json:"instance"`
	// Role is RoleRelay or RoleConsumer.
	Role Role `json:"role"`
	// Topology is how the process meets its broker (rabbit.Config.Topology,
	// rocket.Config.Topology).
	Topology broker.Topology `json:"topology"`
	// Topics are the topics a consumer consumes; empty for a relay.
	Topics []string `json:"topics,omitempty"`
	// StartedAt and SeenAt are read back: when the process announced itself
	// and its last heartbeat, by the database's clock.
	StartedAt time.Time `json:"started_at,omitzero"`
	SeenAt    time.Time `json:"seen_at,omitzero"`
}

// PresenceConfig configures Announce. Every zero value means the default
// stated.
type PresenceConfig struct {
	// Heartbeat is how often the record is refreshed and the others'
	// checked again. Default DefaultHeartbeat.
	Heartbeat time.Duration
	// Expiry is how long after its last heartbeat a record stops counting
	// as live. Default 3 × Heartbeat.
	Expiry time.Duration
	// WarnOnly makes a consumer whose topology differs start anyway and
	// log the difference, as a relay always does (for a deliberate
	// change rolled out process by process).
	WarnOnly bool
	// Logger receives the warnings. Default slog.Default().
	Logger *slog.Logger
}

// DefaultHeartbeat is PresenceConfig.Heartbeat's default: one row written
// and one small table read every 10 s per process.
const DefaultHeartbeat = 10 * time.Second

// forgetAfter is how many expiries a record of a process that never said
// goodbye (it crashed) stays before a heartbeat deletes it.
const forgetAfter = 100

func (c PresenceConfig) withDefaults() PresenceConfig {
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Expiry <= 0 {
		c.Expiry = 3 * c.Heartbeat
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Announcement is a process's live presence; Close ends it.
type Announcement struct {
	db   *sql.DB
	p    Presence
	cfg  PresenceConfig
	stop context.CancelFunc
	done chan struct{}
	once sync.Once

	mu     sync.Mutex
	warned map[string]bool // differences already logged
}

// Announce records p in the outbox's database and keeps the record fresh
// until Close, so the other processes can check their broker topology
// against it and status can tell which topics have a consumer. Before it
// writes anything it compares p.Topology with every live record: a
// consumer that differs from any returns ErrTopologyMismatch naming each
// difference (unless cfg.WarnOnly), because its tasks would otherwise sit
// unread with nothing logged; a relay logs the differences and goes on. On
// every heartbeat it compares again and logs each new difference once, so
// a relay hears of a consumer that started after it.
func Announce(ctx context.Context, db *sql.DB, p Presence, cfg PresenceConfig) (*Announcement, error) {
	cfg = cfg.withDefaults()
	if db == nil {
		return nil, errors.New("outbox: Announce needs a database")
	}
	if p.Role != RoleRelay && p.Role != RoleConsumer {
		return nil, fmt.Errorf("outbox: Announce: role %q: want %q or %q", p.Role, RoleRelay, RoleConsumer)
	}
	if p.Topology.Broker == "" {
		return nil, errors.New("outbox: Announce: the topology names no broker")
	}
	for _, t := range p.Topics {
		if err := broker.ValidateTopic(t); err != nil {
			return nil, fmt.Errorf("outbox: Announce: %w", err)
		}
	}
	if p.Instance == "" {
		p.Instance = instanceName()
	}
	if len(p.Instance) > 191 || strings.IndexFunc(p.Instance, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		return nil, fmt.Errorf("outbox: Announce: instance name %q: want 1 to 191 printable ASCII characters, no spaces", p.Instance)
	}
	a := &Announcement{db: db, p: p, cfg: cfg, done: make(chan struct{}), warned: map[string]bool{}}
	diffs, err := a.check(ctx)
	if err != nil {
		return nil, err
	}
	if len(diffs) > 0 && p.Role == RoleConsumer && !cfg.WarnOnly {
		return nil, fmt.Errorf("%w: this %s (%s) and %s", ErrTopologyMismatch, p.Role, p.Topology, strings.Join(diffs, "; "))
	}
	a.warn(diffs)
	if err := a.beat(ctx, true); err != nil {
		return nil, err
	}
	hctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	a.stop = stop
	go a.loop(hctx)
	return a, nil
}

// Instance returns the name the presence is recorded under.
func (a *Announcement) Instance() string { return a.p.Instance }

// Close stops the heartbeat and deletes the record, so the process stops
// counting as live at once rather than after Expiry.
func (a *Announcement) Close(ctx context.Context) error {
	var err error
	a.once.Do(func() {
		a.stop()
		<-a.done
		if _, e := a.db.ExecContext(ctx, "DELETE FROM delaybridge_presence WHERE instance = ?", a.p.Instance); e != nil {
			err = fmt.Errorf("outbox: withdraw presence: %w", e)
		}
	})
	return err
}

func (a *Announcement) loop(ctx context.Context) {
	defer close(a.done)
	t := time.NewTicker(a.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := a.beat(ctx, false); err != nil && ctx.Err() == nil {
			a.cfg.Logger.Warn("delaybridge: presence heartbeat failed", "instance", a.p.Instance, "err", err)
			continue
		}
		diffs, err := a.check(ctx)
		if err != nil && ctx.Err() == nil {
			a.cfg.Logger.Warn("delaybridge: reading the other processes' topology failed", "err", err)
			continue
		}
		a.warn(diffs)
	}
}

// beat writes the record (first: all of it) and forgets records of
// processes that died long ago.
func (a *Announcement) beat(ctx context.Context, first bool) error {
	if !first {
		res, err := a.db.ExecContext(ctx, "UPDATE delaybridge_presence SET seen_ms = "+store.DBNowMS+" WHERE instance = ?", a.p.Instance)
		if err != nil {
			return fmt.Errorf("outbox: presence heartbeat: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			_, err := a.db.ExecContext(ctx, "DELETE FROM delaybridge_presence WHERE seen_ms < "+store.DBNowMS+" - ?",
				forgetAfter*a.cfg.Expiry.Milliseconds())
			return err
		}
		// Deleted meanwhile (by hand, or forgotten after a long pause):
		// write it whole again.
	}
	topo, err := json.Marshal(a.p.Topology)
	if err != nil {
		return fmt.Errorf("outbox: presence: %w", err)
	}
	if _, err := a.db.ExecContext(ctx, `INSERT INTO delaybridge_presence (instance, role, topology, topics, started_ms, seen_ms)
VALUES (?, ?, ?, ?, `+store.DBNowMS+`, `+store.DBNowMS+`)
ON DUPLICATE KEY UPDATE role = VALUES(role), topology = VALUES(topology), topics = VALUES(topics), seen_ms = VALUES(seen_ms)`,
		a.p.Instance, string(a.p.Role), string(topo), strings.Join(a.p.Topics, " ")); err != nil {
		return fmt.Errorf("outbox: record presence: %w", err)
	}
	return nil
}

// check compares the topology with every other live record.
func (a *Announcement) check(ctx context.Context) ([]string, error) {
	live, err := LivePresences(ctx, a.db, a.cfg.Expiry)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, o := range live {
		if o.Instance == a.p.Instance {
			continue
		}
		for _, d := range a.p.Topology.Diff(o.Topology) {
			out = append(out, fmt.Sprintf("%s %s differ in %s", o.Role, o.Instance, d))
		}
	}
	return out, nil
}

// warn logs each difference not logged before.
func (a *Announcement) warn(diffs []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range diffs {
		if a.warned[d] {
			continue
		}
		a.warned[d] = true
		a.cfg.Logger.Warn("delaybridge: broker topology differs from another live process's: its tasks may sit in queues the other never reads",
			"role", string(a.p.Role), "instance", a.p.Instance, "here", a.p.Topology.String(), "difference", d)
	}
}

// LivePresences returns the records whose last heartbeat is within expiry
// by the database's clock, ordered by instance. It reads the small
// presence table whole: a row per process.
func LivePresences(ctx context.Context, q Querier, expiry time.Duration) ([]Presence, error) {
	rows, err := q.QueryContext(ctx, `SELECT instance, role, topology, topics, started_ms, seen_ms FROM delaybridge_presence
WHERE seen_ms >= `+store.DBNowMS+` - ? ORDER BY instance`, expiry.Milliseconds())
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1146 {
			return nil, fmt.Errorf("outbox: read presences: the delaybridge_presence table is missing; apply migration 5 (delaybridge migrate): %w", err)
		}
		return nil, fmt.Errorf("outbox: read presences: %w", err)
	}
	defer rows.Close()
	var out []Presence
	for rows.Next() {
		var (
			p                Presence
			role, topo, tops string
			started, seen    int64
		)
		if err := rows.Scan(&p.Instance, &role, &topo, &tops, &started, &seen); err != nil {
			return nil, fmt.Errorf("outbox: read presences: %w", err)
		}
		if err := json.Unmarshal([]byte(topo), &p.Topology); err != nil {
			return nil, fmt.Errorf("outbox: presence %s: topology: %w", p.Instance, err)
		}
		p.Role, p.Topics = Role(role), strings.Fields(tops)
		p.StartedAt, p.SeenAt = store.MsTime(started), store.MsTime(seen)
		out = append(out, p)
	}
	return out, rows.Err()
}

// instanceName is host:pid:random, unique per process and readable.
func instanceName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	host = strings.Map(func(r rune) rune {
		if r <= ' ' || r > '~' {
			return '_'
		}
		return r
	}, host)
	name := fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	if len(name) > 191 {
		name = name[len(name)-191:]
	}
	return name
}
