// Package store holds the delay_task queries the relay (outbox) and the
// scanner share: claiming rows under a lease and recording what their
// publish did. It is machinery, not API: states are the plain strings
// stored in delay_task.state.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// States of delay_task rows, as stored; outbox.State names the same values.
const (
	Pending   = "pending"
	Published = "published"
	Done      = "done"
	Cancelled = "cancelled"
)

// Claimed is one task row a claim locked, as the message to publish for it.
type Claimed struct {
	Message *broker.Message
	// HeadersErr is set when the row's headers could not be read or no
	// broker would carry them (a hand-edited row); the message then
	// carries none rather than block or be refused.
	HeadersErr error
}

// ClaimSpec says which rows a claim takes and how long it holds them.
type ClaimSpec struct {
	// State is the state of the rows to take.
	State string
	// DueAtMost, ReadyAtMost and PublishedAtMost bound due_ms,
	// next_attempt_ms and published_ms (epoch milliseconds, inclusive).
	DueAtMost, ReadyAtMost, PublishedAtMost int64
	// Limit is the most rows to take, oldest due first.
	Limit int
	// Owner names the claim on each row it takes (NewLeaseOwner).
	Owner int64
	// LeaseUntil is when the rows become claimable again if the claimer
	// never records an outcome (it crashed): stored in next_attempt_ms.
	LeaseUntil int64
	// MaxBytes bounds the payload bytes one claim takes: rows are taken
	// oldest first while their payloads fit (the first always does). Zero
	// means no bound.
	MaxBytes int64
	// After, when set, makes the claim start past this row of the index
	// rather than at its beginning: only rows after After in (due_ms, id)
	// order are taken. A claimer draining a backlog passes the last row of
	// its previous claim, so the claim does not read again, one by one,
	// the rows still leased to the claims before it.
	After *Position
	// ExcludeTopics leaves the rows of these topics out: the scanner's
	// hold on topics whose last rescue is still unhandled. Each is a
	// topic broker.ValidateTopic accepts (FirstQuery refuses others).
	ExcludeTopics []string
	// Topic, when set, takes only the rows of this topic, one
	// broker.ValidateTopic accepts: a relay's claim for a topic it
	// publishes at a bounded rate.
	Topic string
	// HandOffAt, when set (epoch milliseconds), makes the claim record the
	// hand-off to the broker with the lease, in the same row write: state
	// published, published_ms = HandOffAt, one more publish attempt. The
	// relay claims so: a confirmed publish then writes nothing, and only a
	// failed one writes again (MarkHandOffFailed, back to pending). A
	// relay that dies after the claim leaves published rows the scanner
	// re-publishes once they are overdue, as it does a message the broker
	// lost. Zero (the scanner's claim) leaves the state as it is.
	HandOffAt int64
}

// Position is a row's place in the (state, due_ms, id) index.
type Position struct {
	DueMS, ID int64
}

// Before reports whether p comes before q in the index.
func (p Position) Before(q Position) bool {
	return p.DueMS < q.DueMS || p.DueMS == q.DueMS && p.ID < q.ID
}

// PositionOf returns where the claimed row c is in the index.
func PositionOf(c Claimed) Position {
	return Position{DueMS: c.Message.DeliverAt.UnixMilli(), ID: c.Message.TaskID}
}

// NewLeaseOwner returns a random non-zero lease owner for one claim.
func NewLeaseOwner() int64 {
	for {
		if v := rand.Int64(); v != 0 {
			return v
		}
	}
}

// ClaimLeased takes up to spec.Limit rows and leases them to spec.Owner, in
// one short transaction that commits before it returns (ClaimLeasedEarly
// returns while the commit is still under way): it locks the rows
// with FOR UPDATE SKIP LOCKED (READ COMMITTED, so only those rows and no
// index gaps), stamps each with the owner and the lease's expiry, and
// commits. No lock outlives the claim, so a business transaction touching a
// claimed row (Cancel in a payment) never waits for a broker. The claimer
// records each row's outcome with conditions on the owner (MarkRescued,
// MarkHandOffFailed, Release), and a row whose lease expired unrecorded is
// taken again: a relay's (HandOffAt), published, by the scanner once
// overdue; a scanner's by the next rescue.
//
// It is the one query the relay (pending rows) and the scanner (published
// rows overdue) share: a range of the (state, due_ms, id) index.
func ClaimLeased(ctx context.Context, db *sql.DB, spec ClaimSpec) ([]Claimed, error) {
	out, commit, err := ClaimLeasedEarly(ctx, db, spec)
	if err != nil {
		return nil, err
	}
	if err := commit(); err != nil {
		return nil, err
	}
	return out, nil
}

// ClaimLeasedEarly is ClaimLeased that hands back the rows while the
// claim's commit (a log flush, the slowest step of a claim on a busy
// disk) is still under way: the caller publishes them meanwhile and calls
// commit, which waits for the commit's answer, before it records any
// outcome on them. The rows stay locked until the commit ends, whatever
// the broker does, so no business transaction waits on a broker. If the
// commit fails, the lease may or may not be in (the answer can be lost
// after the server committed): the caller records nothing, and a later
// claim publishes the rows again once they are free or their lease
// expired (Handle makes the second copy harmless). commit must be called
// once when err is nil.
func ClaimLeasedEarly(ctx context.Context, db *sql.DB, spec ClaimSpec) (out []Claimed, commit func() error, err error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: claim %s: begin: %w", spec.State, err)
	}
	committing := false
	defer func() {
		if !committing {
			_ = tx.Rollback()
		}
	}()
	// Rows past MaxBytes are read and dropped, never kept: a batch of large
	// payloads never sits in memory whole, and they stay for the next claim
	// (their locks go with the commit; only kept rows are leased).
	query, args := ClaimQuery(spec)
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: claim %s: %w", spec.State, err)
	}
	defer rows.Close()
	var bytes int64
	full := false
	for rows.Next() {
		var (
			c              Claimed
			m              broker.Message
			key            []byte
			dueMS          int64
			payload        sql.RawBytes
			headers, trace sql.NullString
		)
		if err := rows.Scan(&m.TaskID, &m.Topic, &key, &dueMS, &payload, &headers, &trace, &m.Generation, &m.Attempt); err != nil {
			return nil, nil, fmt.Errorf("outbox: read claim: %w", err)
		}
		size := int64(len(payload))
		if full || spec.MaxBytes > 0 && len(out) > 0 && bytes+size > spec.MaxBytes {
			full = true // this row and the rest stay for the next claim
			continue
		}
		bytes += size
		m.Payload = append([]byte{}, payload...)
		m.Key, m.DeliverAt, m.Trace = string(key), time.UnixMilli(dueMS).UTC(), trace.String
		if headers.Valid {
			m.Headers, c.HeadersErr = DecodeHeaders(headers.String)
		}
		c.Message = &m
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("outbox: claim %s: %w", spec.State, err)
	}
	if err := rows.Close(); err != nil {
		return nil, nil, fmt.Errorf("outbox: claim %s: %w", spec.State, err)
	}
	if len(out) == 0 {
		committing = true
		err := tx.Commit()
		return nil, func() error { return err }, nil
	}
	ids := make([]int64, len(out))
	for i, c := range out {
		ids[i] = c.Message.TaskID
	}
	set, setArgs := "lease_owner = ?, next_attempt_ms = ?", []any{spec.Owner, spec.LeaseUntil}
	if spec.HandOffAt != 0 {
		set += ", state = 'published', published_ms = ?, updated_ms = ?, publish_attempts = publish_attempts + 1, last_error = NULL"
		setArgs = append(setArgs, spec.HandOffAt, spec.HandOffAt)
	}
	for _, chunk := range Chunks(ids) {
		args := append(slices.Clone(setArgs), chunk...)
		if _, err := tx.ExecContext(ctx, "UPDATE delay_task FORCE INDEX (PRIMARY) SET "+set+" WHERE id IN "+InList(len(chunk)), args...); err != nil {
			return nil, nil, fmt.Errorf("outbox: claim %s: lease: %w", spec.State, err)
		}
	}
	// The commit runs on while the caller publishes; from here on only it
	// ends the transaction (a Rollback racing it could undo the lease).
	committing = true
	done := make(chan error, 1)
	go func() { done <- tx.Commit() }()
	return out, func() error {
		if err := <-done; err != nil {
			return fmt.Errorf("outbox: claim %s: commit: %w", spec.State, err)
		}
		return nil
	}, nil
}

// ClaimQuery returns the statement ClaimLeased runs to read and lock the
// rows of spec, and its arguments: tests EXPLAIN it as it runs.
func ClaimQuery(spec ClaimSpec) (string, []any) {
	after, args := "", []any{spec.State, spec.DueAtMost, spec.ReadyAtMost, spec.PublishedAtMost}
	if p := spec.After; p != nil {
		// Two ranges of the index: the rest of After's due_ms, then
		// every later due_ms.
		after = " AND (due_ms > ? OR due_ms = ? AND id > ?)"
		args = append(args, p.DueMS, p.DueMS, p.ID)
	}
	if len(spec.ExcludeTopics) > 0 {
		// topic is the index's last column: the rows left out are
		// skipped on the index, without reading them.
		after += " AND topic NOT IN " + InList(len(spec.ExcludeTopics))
		for _, t := range spec.ExcludeTopics {
			args = append(args, t)
		}
	}
	if spec.Topic != "" {
		after += " AND topic = ?"
		args = append(args, spec.Topic)
	}
	return `SELECT id, topic, task_key, due_ms, payload, headers, trace, generation, attempts
FROM delay_task FORCE INDEX (ix_delay_task_state_due)
WHERE state = ? AND due_ms <= ? AND next_attempt_ms <= ? AND published_ms <= ?` + after + `
ORDER BY due_ms, id LIMIT ? FOR UPDATE SKIP LOCKED`, append(args, spec.Limit)
}

// First returns the place of the first row ClaimLeased(spec) would take
// from the head of the index (After is not read), nil if there is none,
// with one read of the index and neither a lock nor a transaction: a
// claimer looks with it before it claims, as an empty claim is four round
// trips (isolation, begin, select, commit). A row another claim holds
// locked still counts. Its numbers are written into the statement, so it
// costs one round trip whatever the DSN's interpolateParams.
func First(ctx context.Context, db *sql.DB, spec ClaimSpec) (*Position, error) {
	query, err := FirstQuery(spec)
	if err != nil {
		return nil, err
	}
	var p Position
	err = db.QueryRowContext(ctx, query).Scan(&p.DueMS, &p.ID)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: first claimable %s: %w", spec.State, err)
	}
	return &p, nil
}

// FirstQuery returns the statement First runs for spec: tests EXPLAIN it
// as it runs.
func FirstQuery(spec ClaimSpec) (string, error) {
	if spec.State != Pending && spec.State != Published {
		return "", fmt.Errorf("outbox: first claimable: state %q is not claimed", spec.State)
	}
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	exclude := ""
	if len(spec.ExcludeTopics) > 0 {
		quoted := make([]string, len(spec.ExcludeTopics))
		for i, t := range spec.ExcludeTopics {
			// Only [A-Za-z0-9_-]: safe to write between quotes.
			if err := broker.ValidateTopic(t); err != nil {
				return "", fmt.Errorf("outbox: first claimable: excluded %w", err)
			}
			quoted[i] = "'" + t + "'"
		}
		exclude = " AND topic NOT IN (" + strings.Join(quoted, ",") + ")"
	}
	if spec.Topic != "" {
		if err := broker.ValidateTopic(spec.Topic); err != nil {
			return "", fmt.Errorf("outbox: first claimable: %w", err)
		}
		exclude += " AND topic = '" + spec.Topic + "'"
	}
	return "SELECT due_ms, id FROM delay_task FORCE INDEX (ix_delay_task_state_due) WHERE state = '" + spec.State +
		"' AND due_ms <= " + n(spec.DueAtMost) + " AND next_attempt_ms <= " + n(spec.ReadyAtMost) +
		" AND published_ms <= " + n(spec.PublishedAtMost) + exclude + " ORDER BY due_ms, id LIMIT 1", nil
}

// Outcome statements of a claim. Each runs in its own short transaction
// and changes a row only while the claim still owns it, is of the
// generation it published, and is in the state the claim left it in
// (published, for a relay's hand-off). The
// owner and the state are what the API can reach: Reschedule and Replay
// clear the lease along with the generation they bump, Cancel changes the
// state. The generation is a second guard, for a row changed by other
// means (a hand-written UPDATE, an older binary) without clearing the
// lease.

// MarkRescued records that claimed published rows were re-published at at:
// the rescue counted, the next rescue no sooner than backoff(rescues) after.
// The rescue is counted even on a row a consumer finished (or a payment
// cancelled) between the publish and this record: it happened.
func MarkRescued(ctx context.Context, db *sql.DB, owner int64, c []Claimed, at int64, grace, maxWait time.Duration) (int64, error) {
	// next_attempt_ms is compared with now - grace, like published_ms, so
	// the wait past grace is grace × (2^rescues − 1): grace, then 2×,
	// 4× ... after each rescue, up to maxWait. The assignment to
	// next_attempt_ms comes first so it reads rescues before the increment.
	return updateOwnedIn(ctx, db, owner, []string{Published, Done, Cancelled}, c,
		"next_attempt_ms = ? + LEAST(? * ((1 << LEAST(rescues, 8)) - 1), ?), rescues = rescues + 1, published_ms = ?, updated_ms = ?, lease_owner = 0",
		at, grace.Milliseconds(), maxWait.Milliseconds(), at, at)
}

// MarkFailed records a transient publish failure on claimed rows: the
// lease gone, the next attempt no sooner than at + initial × 2^attempts,
// at most maxWait, less skew (a scanner passes its grace, which it adds
// back when it compares).
func MarkFailed(ctx context.Context, db *sql.DB, owner int64, from string, c []Claimed, at int64, initial, maxWait, skew time.Duration, reason string) (int64, error) {
	return updateOwned(ctx, db, owner, from, c,
		"next_attempt_ms = ? + LEAST(? << LEAST(publish_attempts, 30), ?) - ?, publish_attempts = publish_attempts + 1, last_error = ?, updated_ms = ?, lease_owner = 0",
		at, initial.Milliseconds(), maxWait.Milliseconds(), skew.Milliseconds(), Truncate(reason, 1024), at)
}

// MarkDead records that the broker refused claimed rows for good.
func MarkDead(ctx context.Context, db *sql.DB, owner int64, from string, c []Claimed, at int64, reason string) (int64, error) {
	return updateOwned(ctx, db, owner, from, c,
		"state = 'dead', publish_attempts = publish_attempts + 1, last_error = ?, updated_ms = ?, next_attempt_ms = 0, lease_owner = 0",
		Truncate(reason, 1024), at)
}

// Release gives claimed rows back at once, untouched otherwise: for a
// claimer stopping before it knows how their publish went.
func Release(ctx context.Context, db *sql.DB, owner int64, from string, c []Claimed) (int64, error) {
	return updateOwned(ctx, db, owner, from, c, "next_attempt_ms = 0, lease_owner = 0")
}

// The hand-off's outcomes. A relay's claim (ClaimSpec.HandOffAt) already
// marked its rows published and counted the attempt; a confirmed publish
// writes nothing more. These undo the mark on the rows whose publish did
// not go through, under the same conditions as the statements above
// (owner, state published, generation).

// MarkHandOffFailed puts claimed rows whose publish failed for now back
// to pending, the lease gone, the next attempt no sooner than at +
// initial × 2^(attempts before this one), at most maxWait.
func MarkHandOffFailed(ctx context.Context, db *sql.DB, owner int64, c []Claimed, at int64, initial, maxWait time.Duration, reason string) (int64, error) {
	return updateOwned(ctx, db, owner, Published, c,
		"next_attempt_ms = ? + LEAST(? << LEAST(GREATEST(publish_attempts - 1, 0), 30), ?), last_error = ?, updated_ms = ?, lease_owner = 0, published_ms = 0, state = 'pending'",
		at, initial.Milliseconds(), maxWait.Milliseconds(), Truncate(reason, 1024), at)
}

// MarkHandOffDead records that the broker refused claimed rows for good,
// or that the relay does not publish them.
func MarkHandOffDead(ctx context.Context, db *sql.DB, owner int64, c []Claimed, at int64, reason string) (int64, error) {
	return updateOwned(ctx, db, owner, Published, c,
		"state = 'dead', last_error = ?, updated_ms = ?, next_attempt_ms = 0, lease_owner = 0, published_ms = 0",
		Truncate(reason, 1024), at)
}

// ReleaseHandOff gives claimed rows back to pending at once, the attempt
// uncounted: for a relay stopping before it knows how their publish went.
// The last error the claim cleared (a failed publish's, a snooze's reason)
// stays cleared.
func ReleaseHandOff(ctx context.Context, db *sql.DB, owner int64, c []Claimed) (int64, error) {
	return updateOwned(ctx, db, owner, Published, c,
		"next_attempt_ms = 0, lease_owner = 0, published_ms = 0, publish_attempts = GREATEST(publish_attempts - 1, 0), state = 'pending'")
}

// SplitResults sorts claimed rows by the outcome of their publish (results
// as broker.PublishResults gives them, one per row): confirmed, failed for
// now, and refused for good.
func SplitResults(c []Claimed, results []error) (ok, failed, refused []Claimed) {
	for i, cl := range c {
		switch err := results[i]; {
		case err == nil:
			ok = append(ok, cl)
		case broker.IsPermanent(err):
			refused = append(refused, cl)
		default:
			failed = append(failed, cl)
		}
	}
	return ok, failed, refused
}

// updateOwned runs "UPDATE delay_task SET set" over the rows of c that
// owner still holds in state from at the generation claimed, in chunks.
func updateOwned(ctx context.Context, db *sql.DB, owner int64, from string, c []Claimed, set string, setArgs ...any) (int64, error) {
	return updateOwnedIn(ctx, db, owner, []string{from}, c, set, setArgs...)
}

// updateOwnedIn is updateOwned for rows in any of the states from.
func updateOwnedIn(ctx context.Context, db *sql.DB, owner int64, from []string, c []Claimed, set string, setArgs ...any) (int64, error) {
	byGen := map[int64][]int64{}
	for _, cl := range c {
		byGen[cl.Message.Generation] = append(byGen[cl.Message.Generation], cl.Message.TaskID)
	}
	var n int64
	for gen, ids := range byGen {
		for _, chunk := range Chunks(ids) {
			args := slices.Clone(setArgs)
			args = append(args, owner)
			for _, st := range from {
				args = append(args, st)
			}
			args = append(append(args, gen), chunk...)
			query := "UPDATE delay_task FORCE INDEX (PRIMARY) SET " + set + " WHERE lease_owner = ? AND state IN " + InList(len(from)) + " AND generation = ? AND id IN " + InList(len(chunk))
			res, err := db.ExecContext(ctx, query, args...)
			// A deadlock's victim is rolled back whole; unrecorded, its rows
			// would stay as the claim left them, leased, until the lease
			// expired and a later claim or rescue published them again.
			// Running it again is what the server asks for.
			for retries := 0; IsDeadlock(err) && retries < outcomeDeadlockRetries && ctx.Err() == nil; retries++ {
				res, err = db.ExecContext(ctx, query, args...)
			}
			if err != nil {
				return n, fmt.Errorf("outbox: record claim outcome: %w", err)
			}
			k, _ := res.RowsAffected()
			n += k
		}
	}
	return n, nil
}

// outcomeDeadlockRetries is how many times an outcome statement runs again
// after the server chose it as a deadlock's victim.
const outcomeDeadlockRetries = 3

// IsDeadlock reports whether err is the server's deadlock verdict (MySQL
// and MariaDB error 1213), which rolls the whole transaction back.
func IsDeadlock(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1213
}

// maxInList keeps one statement's placeholders far below the server's
// limit of 65,535, whatever batch size is configured.
const maxInList = 5000

// Chunks splits ids into slices of at most maxInList, as []any for Exec.
func Chunks(ids []int64) [][]any {
	var out [][]any
	for len(ids) > 0 {
		n := min(len(ids), maxInList)
		chunk := make([]any, n)
		for i, id := range ids[:n] {
			chunk[i] = id
		}
		out = append(out, chunk)
		ids = ids[n:]
	}
	return out
}

// InList returns "(?,?,…)" with n placeholders.
func InList(n int) string { return "(?" + strings.Repeat(",?", n-1) + ")" }

// Truncate cuts s to at most n bytes without splitting a UTF-8 sequence, so
// the result fits a VARCHAR in strict mode.
func Truncate(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	return strings.ToValidUTF8(s, "")
}
