package scanner

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/store"
)

// Config configures a Scanner. Every zero value means the default stated.
type Config struct {
	// Grace is how long past its due time a published task may stay not
	// done before it is rescued. Default DefaultGrace plus the publisher's
	// precision (see Grace).
	Grace time.Duration
	// Interval is the pause between passes when the last one found nothing
	// to rescue. Default DefaultInterval.
	Interval time.Duration
	// BatchSize is how many rows one claim takes. Default DefaultBatchSize.
	BatchSize int
	// MaxRate bounds rescues per second, so the backlog after an outage
	// drains steadily instead of flooding the broker. Default
	// DefaultMaxRate.
	MaxRate int
	// HoldWhileBehind bounds how long the scanner waits for its last
	// rescue of a topic to be handled: until at least half of those tasks
	// are done (or no longer published), no more of that topic's are
	// rescued. Re-published tasks that stay undone mean the topic's
	// consumers are behind or down rather than that the broker lost
	// messages, and more copies would only lengthen their queue (a backlog
	// rescued again and again collapses under its duplicates). Other
	// topics' tasks are rescued meanwhile: a topic whose consumers are
	// down does not keep the messages a broker lost of another from being
	// rescued. Default DefaultHoldWhileBehind; negative disables the hold.
	HoldWhileBehind time.Duration
	// PublishTimeout bounds one re-publish of a batch. Default
	// outbox.DefaultPublishTimeout.
	PublishTimeout time.Duration
	// Lease is how long a rescue owns the rows it claimed before another
	// scanner may take them. Default outbox.DefaultLease, or
	// PublishTimeout plus 10s when that is longer; it must outlast
	// PublishTimeout.
	Lease time.Duration
	// RetryInitial and RetryMax shape the per-row wait after a failed
	// re-publish, doubling per failure. Defaults DefaultRetryInitial and
	// DefaultRetryMax.
	RetryInitial, RetryMax time.Duration
	// PendingAlert flags pending tasks due longer ago than this: the relay
	// is down or stuck. Default DefaultPendingAlert.
	PendingAlert time.Duration
	// Business is an optional last line of defence for tasks never written.
	Business *Business
	// Hooks are metric callbacks; any may be nil.
	Hooks Hooks
	// Logger receives the scanner's logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Business is a user query for keys whose task should have run but may never
// have been written (e.g. UNPAID orders whose expire_at passed five minutes
// ago). Keys go straight to Handle, without a broker.
type Business struct {
	// Name identifies the source in logs and in the lock that keeps two
	// scanners from running it at once. [A-Za-z0-9_-].
	Name string
	// Every is the pause between runs. Default DefaultBusinessEvery.
	Every time.Duration
	// Query returns up to limit keys to handle.
	Query func(ctx context.Context, db *sql.DB, limit int) ([]string, error)
	// Handle acts on one key. It must be idempotent (a conditional UPDATE).
	Handle func(ctx context.Context, key string) error
}

// Hooks are called after each pass, for metrics.
type Hooks struct {
	// Rescued reports tasks published again.
	Rescued func(n int)
	// Backlog reports pending tasks overdue by more than PendingAlert, and
	// dead tasks.
	Backlog func(stuckPending, dead int)
	// BusinessHandled reports keys the business source handled.
	BusinessHandled func(n int)
}

// Scanner is the backstop over the outbox: it re-publishes published tasks
// that are overdue and not done, flags pending and dead backlogs, and runs an
// optional business query. It reads only the overdue slice of delay_task
// through the (state, due_ms) index.
//
// Several scanners may run at once: each claim leases its rows in a short
// transaction (FOR UPDATE SKIP LOCKED, then a lease stamp, then commit), so
// two scanners never rescue the same task in the same round and no lock is
// held while a broker is slow; the business source runs under a named
// database lock. A scanner killed mid-pass leaves its rows leased; they
// are rescued again when the lease expires, at worst published twice,
// which Handle makes harmless.
type Scanner struct {
	db  *sql.DB
	pub broker.Publisher
	cfg Config

	mu   sync.Mutex
	held map[string]*lastRescue // by topic, while HoldWhileBehind lasts

	// logMu guards what Backlog last saw, so a count that stays the same
	// is not logged again every pass.
	logMu       sync.Mutex
	stuckLogged backlogLog
	deadLogged  backlogLog
}

// backlogReminder is how often Backlog repeats a warning whose count has
// not risen: a count that stays up is not forgotten, nor logged every
// pass.
const backlogReminder = time.Hour

// backlogLog is one backlog count as Backlog last saw it, and when it last
// logged it.
type backlogLog struct {
	n  int
	at time.Time
}

// next records n and says what to log: warn when n rose since the last
// pass or has not been logged for backlogReminder, cleared when it fell
// to zero.
func (l *backlogLog) next(n int, now time.Time) (warn, cleared bool) {
	prev := l.n
	l.n = n
	switch {
	case n == 0:
		return false, prev > 0
	case n > prev || now.Sub(l.at) >= backlogReminder:
		l.at = now
		return true, false
	}
	return false, false
}

// lastRescue is what the last rescue of one topic published, and when.
type lastRescue struct {
	ids []int64
	at  time.Time
}

// DefaultGrace is the grace a zero Config.Grace starts from; delaybridge
// run --grace has the same default.
const DefaultGrace = 10 * time.Second

// Defaults of the other Config and Business fields.
const (
	// DefaultInterval is the pause after a pass that rescued nothing.
	DefaultInterval = time.Second
	// DefaultBatchSize is the rows one claim takes.
	DefaultBatchSize = 500
	// DefaultMaxRate bounds rescues per second.
	DefaultMaxRate = 2000
	// DefaultHoldWhileBehind is how long a pass waits for the last rescue
	// to be handled.
	DefaultHoldWhileBehind = time.Minute
	// DefaultPendingAlert flags pending tasks due longer ago than this.
	DefaultPendingAlert = time.Minute
	// DefaultRetryInitial and DefaultRetryMax shape the wait after a failed
	// re-publish.
	DefaultRetryInitial = time.Second
	DefaultRetryMax     = 5 * time.Minute
	// DefaultBusinessEvery is the pause between runs of a business query.
	DefaultBusinessEvery = time.Minute
)

// Grace returns the grace a scanner publishing under limits uses for the
// configured one: grace itself when positive, else DefaultGrace plus the
// broker's precision, as a broker may deliver that much after the time it
// was asked for (a RabbitMQ ladder's unit and lead; RocketMQ's publisher
// asks a precision early, which the grace does not count on).
func Grace(grace time.Duration, limits broker.Limits) time.Duration {
	if grace > 0 {
		return grace
	}
	return DefaultGrace + limits.Precision
}

// New returns a scanner that re-publishes through pub.
func New(db *sql.DB, pub broker.Publisher, cfg Config) (*Scanner, error) {
	if db == nil || pub == nil {
		return nil, errors.New("scanner: New needs a database and a publisher")
	}
	cfg, err := cfg.resolve(pub.Limits())
	if err != nil {
		return nil, err
	}
	return &Scanner{db: db, pub: pub, cfg: cfg}, nil
}

// Check reports what New would refuse in c, without a database or a
// broker: a process checks its settings before it connects. limits may be
// left zero when the publisher's are not known yet.
func (c Config) Check(limits broker.Limits) error {
	_, err := c.resolve(limits)
	return err
}

// resolve applies the defaults and refuses settings the scanner cannot
// keep. The business source is copied, so the caller's is left as it was.
func (c Config) resolve(limits broker.Limits) (Config, error) {
	cfg := c
	cfg.Grace = Grace(cfg.Grace, limits)

	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.MaxRate <= 0 {
		cfg.MaxRate = DefaultMaxRate
	}
	if cfg.HoldWhileBehind == 0 {
		cfg.HoldWhileBehind = DefaultHoldWhileBehind
	}
	if cfg.PendingAlert <= 0 {
		cfg.PendingAlert = DefaultPendingAlert
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = outbox.DefaultPublishTimeout
	}
	if cfg.Lease <= 0 {
		cfg.Lease = max(outbox.DefaultLease, cfg.PublishTimeout+store.RecordTimeout)
	}
	if cfg.Lease <= cfg.PublishTimeout {
		return cfg, fmt.Errorf("scanner: Lease %v must be longer than PublishTimeout %v", cfg.Lease, cfg.PublishTimeout)
	}
	if cfg.RetryInitial <= 0 {
		cfg.RetryInitial = DefaultRetryInitial
	}
	if cfg.RetryMax < cfg.RetryInitial {
		cfg.RetryMax = max(DefaultRetryMax, cfg.RetryInitial)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if c.Business != nil {
		b := *c.Business
		if b.Query == nil || b.Handle == nil {
			return cfg, errors.New("scanner: a business source needs Query and Handle")
		}
		if err := broker.ValidateTopic(b.Name); err != nil {
			return cfg, fmt.Errorf("scanner: business source name: %w", err)
		}
		if b.Every <= 0 {
			b.Every = DefaultBusinessEvery
		}
		cfg.Business = &b
	}
	return cfg, nil
}

// Run scans until ctx is done.
func (s *Scanner) Run(ctx context.Context) error {
	var nextBusiness, nextBacklog time.Time
	for ctx.Err() == nil {
		start := time.Now()
		n, err := s.Rescue(ctx)
		if err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("delaybridge scanner: rescue pass failed", "err", err)
		}
		if now := time.Now(); now.After(nextBacklog) {
			nextBacklog = now.Add(10 * s.cfg.Interval)
			if _, _, err := s.Backlog(ctx); err != nil && ctx.Err() == nil {
				s.cfg.Logger.Warn("delaybridge scanner: backlog check failed", "err", err)
			}
		}
		if b := s.cfg.Business; b != nil && time.Now().After(nextBusiness) {
			nextBusiness = time.Now().Add(b.Every)
			if _, err := s.RunBusiness(ctx); err != nil && ctx.Err() == nil {
				s.cfg.Logger.Warn("delaybridge scanner: business source failed", "source", b.Name, "err", err)
			}
		}
		// Rate limit: a full batch may not come sooner than BatchSize/MaxRate
		// after the last; an empty pass waits a whole Interval.
		wait := s.cfg.Interval
		if n > 0 {
			wait = time.Duration(float64(n)/float64(s.cfg.MaxRate)*float64(time.Second)) - time.Since(start)
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
	}
	return nil
}

// Rescue runs one claim: published tasks that are overdue by more than
// Grace and not done, oldest due first, at most BatchSize of them. Overdue
// counts from the latest of the due time, the last publish and the next
// attempt a consumer retry recorded, so a task the relay published late or
// one waiting out a retry backoff is not rescued early. The claim leases
// the rows and commits before anything is published (store.ClaimLeased);
// the re-publish has PublishTimeout. A confirmed rescue is counted on the
// row, and the next rescue of it waits Grace, then twice as long after
// each, up to an hour. A failed re-publish backs off per row too, so rows
// that keep failing (a deleted topic) never crowd out the rescue of
// others; one the broker refuses for good goes dead. While the previous
// rescue is still mostly unhandled it rescues nothing (see
// Config.HoldWhileBehind), of that topic.
func (s *Scanner) Rescue(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	held, err := s.behind(ctx)
	if err != nil {
		return 0, err
	}
	now := s.cfg.Now()
	cut := now.Add(-s.cfg.Grace).UnixMilli() - 1
	owner := store.NewLeaseOwner()
	spec := store.ClaimSpec{
		State: store.Published, DueAtMost: cut, ReadyAtMost: cut, PublishedAtMost: cut,
		Limit: s.cfg.BatchSize, Owner: owner, LeaseUntil: now.Add(s.cfg.Lease).UnixMilli(), MaxBytes: outbox.DefaultMaxBatchBytes,
		ExcludeTopics: held,
	}
	// Most passes find nothing: one read tells, where an empty claim is a
	// transaction of four round trips.
	first, err := store.First(ctx, s.db, spec)
	if err != nil {
		return 0, fmt.Errorf("scanner: %w", err)
	}
	if first == nil {
		return 0, nil
	}
	claimed, err := store.ClaimLeased(ctx, s.db, spec)
	if err != nil {
		return 0, fmt.Errorf("scanner: %w", err)
	}
	if len(claimed) == 0 {
		return 0, nil
	}
	msgs := make([]*broker.Message, len(claimed))
	for i, c := range claimed {
		msgs[i] = c.Message
	}
	pctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	perr := s.pub.Publish(pctx, msgs...)
	cancel()
	results := broker.PublishResults(perr, len(msgs))
	stopping := ctx.Err() != nil
	stamp := s.cfg.Now().UnixMilli()
	ok, failed, dead, rerr := store.Record(ctx, s.db, claimed, results, store.RecordParams{
		Owner: owner, From: store.Published, Stamp: stamp, Stopping: stopping,
		Confirmed: func(rctx context.Context, ok []store.Claimed) error {
			_, err := store.MarkRescued(rctx, s.db, owner, ok, stamp, s.cfg.Grace, time.Hour)
			return err
		},
		// The claim compares next_attempt_ms with now - Grace, so a failed
		// row's backoff is stored less Grace to wait what it says.
		RetryInitial: s.cfg.RetryInitial, RetryMax: s.cfg.RetryMax, Skew: s.cfg.Grace,
		RefusedPrefix: "rescue rejected: ", FailedPrefix: "rescue failed: ",
	})
	if len(dead) > 0 {
		s.cfg.Logger.Error("delaybridge scanner: broker refused a re-publish for good; marked dead", "rows", len(dead), "err", perr)
	}
	if len(failed) > 0 && !stopping {
		s.cfg.Logger.Warn("delaybridge scanner: re-publish failed; those rows back off", "rows", len(failed), "err", perr)
	}
	rescued := len(ok)
	if rescued > 0 {
		at := s.cfg.Now()
		if s.held == nil {
			s.held = map[string]*lastRescue{}
		}
		fresh := map[string]bool{}
		for _, c := range ok {
			t := c.Message.Topic
			if !fresh[t] {
				fresh[t] = true
				s.held[t] = &lastRescue{at: at}
			}
			s.held[t].ids = append(s.held[t].ids, c.Message.TaskID)
		}
		s.cfg.Logger.Info("delaybridge scanner: rescued overdue tasks", "rows", rescued)
		if s.cfg.Hooks.Rescued != nil {
			s.cfg.Hooks.Rescued(rescued)
		}
	}
	if rerr != nil {
		return len(claimed), fmt.Errorf("scanner: record rescue: %w", rerr)
	}
	return len(claimed), nil
}

// behind returns the topics whose last rescue is still mostly unhandled
// and younger than HoldWhileBehind, in order: this pass rescues none of
// theirs.
func (s *Scanner) behind(ctx context.Context) ([]string, error) {
	if s.cfg.HoldWhileBehind < 0 || len(s.held) == 0 {
		return nil, nil
	}
	now := s.cfg.Now()
	var ids []int64
	for t, r := range s.held {
		if now.Sub(r.at) >= s.cfg.HoldWhileBehind {
			delete(s.held, t)
			continue
		}
		ids = append(ids, r.ids...)
	}
	open := map[string]int{}
	for _, chunk := range store.Chunks(ids) {
		rows, err := s.db.QueryContext(ctx, "SELECT topic, COUNT(*) FROM delay_task WHERE state = 'published' AND id IN "+
			store.InList(len(chunk))+" GROUP BY topic", chunk...)
		if err != nil {
			return nil, fmt.Errorf("scanner: check the last rescue: %w", err)
		}
		for rows.Next() {
			var (
				t string
				n int
			)
			if err := rows.Scan(&t, &n); err != nil {
				rows.Close()
				return nil, fmt.Errorf("scanner: check the last rescue: %w", err)
			}
			open[t] += n
		}
		if err := rows.Err(); err != nil {
			rows.Close()
			return nil, fmt.Errorf("scanner: check the last rescue: %w", err)
		}
		if err := rows.Close(); err != nil {
			return nil, fmt.Errorf("scanner: check the last rescue: %w", err)
		}
	}
	var out []string
	for t, r := range s.held {
		if 2*open[t] > len(r.ids) {
			out = append(out, t)
			s.cfg.Logger.Debug("delaybridge scanner: last rescue not handled yet; holding the topic", "topic", t, "open", open[t], "rescued", len(r.ids))
			continue
		}
		delete(s.held, t)
	}
	slices.Sort(out)
	return out, nil
}

// Backlog counts pending tasks overdue by more than PendingAlert (the relay
// is not keeping up) and dead tasks, and reports them to the Backlog hook.
// It logs a count when it rises, again every backlogReminder while it
// stays up, and once when it falls to zero: Run calls it every 10
// intervals, and the same warning every 10 s tells an operator nothing.
func (s *Scanner) Backlog(ctx context.Context) (stuckPending, dead int, err error) {
	cut := s.cfg.Now().Add(-s.cfg.PendingAlert).UnixMilli()
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM delay_task WHERE state = 'pending' AND due_ms < ?", cut).Scan(&stuckPending); err != nil {
		return 0, 0, fmt.Errorf("scanner: count stuck pending: %w", err)
	}
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM delay_task WHERE state = 'dead'").Scan(&dead); err != nil {
		return 0, 0, fmt.Errorf("scanner: count dead: %w", err)
	}
	now := s.cfg.Now()
	s.logMu.Lock()
	warnStuck, stuckCleared := s.stuckLogged.next(stuckPending, now)
	warnDead, deadCleared := s.deadLogged.next(dead, now)
	s.logMu.Unlock()
	switch {
	case warnStuck:
		s.cfg.Logger.Warn("delaybridge scanner: pending tasks overdue; is the relay running?", "rows", stuckPending, "overdue_by_more_than", s.cfg.PendingAlert)
	case stuckCleared:
		s.cfg.Logger.Info("delaybridge scanner: no pending task is overdue any more", "overdue_by_more_than", s.cfg.PendingAlert)
	}
	switch {
	case warnDead:
		s.cfg.Logger.Warn("delaybridge scanner: dead tasks need attention (delaybridge dead list)", "rows", dead)
	case deadCleared:
		s.cfg.Logger.Info("delaybridge scanner: no dead task left")
	}
	if s.cfg.Hooks.Backlog != nil {
		s.cfg.Hooks.Backlog(stuckPending, dead)
	}
	return stuckPending, dead, nil
}

// RunBusiness runs the business source once under a named lock and returns
// how many keys it handled. When another scanner holds the lock it returns
// 0 at once.
func (s *Scanner) RunBusiness(ctx context.Context) (int, error) {
	b := s.cfg.Business
	if b == nil {
		return 0, nil
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	lock := "delaybridge_business_" + b.Name
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", lock).Scan(&got); err != nil {
		return 0, fmt.Errorf("scanner: business lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return 0, nil
	}
	defer conn.ExecContext(context.Background(), "SELECT RELEASE_LOCK(?)", lock) //nolint:errcheck // released with the connection anyway
	keys, err := b.Query(ctx, s.db, s.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("scanner: business query %s: %w", b.Name, err)
	}
	n := 0
	var errs []string
	for _, k := range keys {
		if err := b.Handle(ctx, k); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", k, err))
			continue
		}
		n++
	}
	if n > 0 {
		s.cfg.Logger.Warn("delaybridge scanner: business source handled keys whose tasks had not run: missing, or late past its query's margin", "source", b.Name, "keys", n)
		if s.cfg.Hooks.BusinessHandled != nil {
			s.cfg.Hooks.BusinessHandled(n)
		}
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("scanner: business source %s: %d key(s) failed: %s", b.Name, len(errs), strings.Join(errs[:min(3, len(errs))], "; "))
	}
	return n, nil
}
