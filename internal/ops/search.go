package ops

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/store"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The reads behind the operator's console (`delaybridge console`). Every one
// is a range of an index, the (topic, task_key) unique key or the (state,
// due_ms, id, topic) index, with a LIMIT, so a page costs the same on a
// thousand rows as on millions; a topic filter on a state's range reads
// index entries (never rows) until it fills the page. None of them writes.

// States lists every task state, in the order the console shows them.
var States = []outbox.State{outbox.StatePending, outbox.StatePublished, outbox.StateDead, outbox.StateDone, outbox.StateCancelled}

// ValidState reports whether s is one of States.
func ValidState(s outbox.State) bool { return slices.Contains(States, s) }

// MaxSearchLimit bounds the rows one search page returns.
const MaxSearchLimit = 500

// SearchQuery selects tasks for the console's search page. The zero value
// lists every task, oldest due first.
type SearchQuery struct {
	// Topic, when set, keeps tasks of this topic only.
	Topic string
	// KeyPrefix, when set, keeps tasks whose key starts with it; it needs
	// Topic (keys are indexed within their topic).
	KeyPrefix string
	// State, when set, keeps tasks in this state only.
	State outbox.State
	// DueFrom and DueTo, when set, keep tasks due in [DueFrom, DueTo).
	DueFrom, DueTo time.Time
	// After is the Next of the previous page; empty for the first page.
	After string
	// Limit is the page size; 0 means 50, at most MaxSearchLimit.
	Limit int
}

// SearchPage is one page of a search.
type SearchPage struct {
	// Tasks hold the rows without payload and headers.
	Tasks []*outbox.TaskInfo
	// Next continues the search after the last task; empty on the last page.
	Next string
	// Index names the index the search walks, for the curious.
	Index string
}

// ErrBadSearch is returned, wrapped, for a search that cannot be served by
// an index or carries a malformed cursor.
var ErrBadSearch = errors.New("outbox: bad search")

// Search returns one page of tasks. Which index serves it depends on the
// filters:
//
//   - a key prefix, or a topic with neither state nor due window: the
//     (topic, task_key) unique key, in key order;
//   - anything else: the (state, due_ms, id, topic) index, one range per
//     state asked for (all five without a state), oldest due first. A
//     topic filter is checked in the index entries of that range, before
//     any row is read.
func Search(ctx context.Context, q outbox.Querier, s SearchQuery) (*SearchPage, error) {
	if err := store.CheckQuerier("Search", q); err != nil {
		return nil, err
	}
	if s.Limit <= 0 {
		s.Limit = 50
	}
	s.Limit = min(s.Limit, MaxSearchLimit)
	if s.State != "" && !ValidState(s.State) {
		return nil, fmt.Errorf("%w: unknown state %q", ErrBadSearch, s.State)
	}
	if s.KeyPrefix != "" && s.Topic == "" {
		return nil, fmt.Errorf("%w: a key search needs its topic", ErrBadSearch)
	}
	if !s.DueFrom.IsZero() && !s.DueTo.IsZero() && !s.DueTo.After(s.DueFrom) {
		return nil, fmt.Errorf("%w: the due window ends before it starts", ErrBadSearch)
	}
	window := !s.DueFrom.IsZero() || !s.DueTo.IsZero()
	switch {
	case s.KeyPrefix != "" || s.Topic != "" && s.State == "" && !window:
		return searchByKey(ctx, q, s)
	default:
		return searchByDue(ctx, q, s)
	}
}

// cursor kinds, the first byte of SearchPage.Next.
const (
	cursorKey = "k"
	cursorDue = "d"
)

// badCursor refuses a cursor that is not one this kind of search makes. It
// does not quote the cursor: a search by topic's cursor is the last key of
// its page, which the console shows only when asked.
func badCursor() error {
	return fmt.Errorf("%w: the page cursor belongs to another search; start the search again from its first page", ErrBadSearch)
}

func searchByKey(ctx context.Context, q outbox.Querier, s SearchQuery) (*SearchPage, error) {
	where := []string{"topic = ?"}
	args := []any{s.Topic}
	if s.KeyPrefix != "" {
		where = append(where, "task_key >= ?")
		args = append(args, []byte(s.KeyPrefix))
		if end, ok := prefixEnd([]byte(s.KeyPrefix)); ok {
			where = append(where, "task_key < ?")
			args = append(args, end)
		}
	}
	if s.After != "" {
		kind, rest, _ := strings.Cut(s.After, ":")
		after, err := hex.DecodeString(rest)
		if kind != cursorKey || err != nil {
			return nil, badCursor()
		}
		where = append(where, "task_key > ?")
		args = append(args, after)
	}
	where, args = appendFilters(where, args, s, false)
	rows, err := queryRows(ctx, q, store.SelectTaskRow+" FORCE INDEX (uk_delay_task_topic_key) WHERE "+strings.Join(where, " AND ")+" ORDER BY task_key LIMIT ?", append(args, s.Limit+1)...)
	if err != nil {
		return nil, err
	}
	page := &SearchPage{Tasks: rows, Index: "uk_delay_task_topic_key"}
	if len(rows) > s.Limit {
		page.Tasks = rows[:s.Limit]
		page.Next = cursorKey + ":" + hex.EncodeToString([]byte(page.Tasks[s.Limit-1].Task.Key))
	}
	return page, nil
}

func searchByDue(ctx context.Context, q outbox.Querier, s SearchQuery) (*SearchPage, error) {
	var afterDue, afterID int64
	hasAfter := s.After != ""
	if hasAfter {
		parts := strings.Split(s.After, ":")
		if len(parts) != 3 || parts[0] != cursorDue {
			return nil, badCursor()
		}
		var err1, err2 error
		afterDue, err1 = strconv.ParseInt(parts[1], 10, 64)
		afterID, err2 = strconv.ParseInt(parts[2], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, badCursor()
		}
	}
	states := States
	if s.State != "" {
		states = []outbox.State{s.State}
	}
	var all []*outbox.TaskInfo
	for _, st := range states {
		where := []string{"state = ?"}
		args := []any{string(st)}
		if hasAfter {
			// Keyset on (due_ms, id): the range starts at the cursor's due
			// time, and rows at that very millisecond continue after its id.
			where = append(where, "due_ms >= ?", "(due_ms > ? OR id > ?)")
			args = append(args, afterDue, afterDue, afterID)
		}
		where, args = appendFilters(where, args, s, true)
		rows, err := queryRows(ctx, q, store.SelectTaskRow+" FORCE INDEX (ix_delay_task_state_due) WHERE "+strings.Join(where, " AND ")+" ORDER BY due_ms, id LIMIT ?", append(args, s.Limit+1)...)
		if err != nil {
			return nil, err
		}
		all = append(all, rows...)
	}
	slices.SortFunc(all, func(a, b *outbox.TaskInfo) int {
		if c := a.Task.DueAt.Compare(b.Task.DueAt); c != 0 {
			return c
		}
		return int(a.ID - b.ID)
	})
	page := &SearchPage{Tasks: all, Index: "ix_delay_task_state_due"}
	if len(all) > s.Limit {
		page.Tasks = all[:s.Limit]
		last := page.Tasks[s.Limit-1]
		page.Next = fmt.Sprintf("%s:%d:%d", cursorDue, last.Task.DueAt.UnixMilli(), last.ID)
	}
	return page, nil
}

// appendFilters adds the filters a search's index does not serve itself.
func appendFilters(where []string, args []any, s SearchQuery, topic bool) ([]string, []any) {
	if topic && s.Topic != "" {
		where = append(where, "topic = ?")
		args = append(args, s.Topic)
	}
	if !topic && s.State != "" {
		where = append(where, "state = ?")
		args = append(args, string(s.State))
	}
	if !s.DueFrom.IsZero() {
		where = append(where, "due_ms >= ?")
		args = append(args, s.DueFrom.UnixMilli())
	}
	if !s.DueTo.IsZero() {
		where = append(where, "due_ms < ?")
		args = append(args, s.DueTo.UnixMilli())
	}
	return where, args
}

// prefixEnd returns the smallest byte string above every string that
// starts with p, and false when there is none (p is all 0xff).
func prefixEnd(p []byte) ([]byte, bool) {
	end := slices.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1], true
		}
	}
	return nil, false
}

func queryRows(ctx context.Context, q outbox.Querier, query string, args ...any) ([]*outbox.TaskInfo, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: search: %w", err)
	}
	defer rows.Close()
	var out []*outbox.TaskInfo
	for rows.Next() {
		i, err := scanInfo(rows)
		if err != nil {
			return nil, fmt.Errorf("outbox: search: %w", err)
		}
		out = append(out, i)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: search: %w", err)
	}
	return out, nil
}

// Detail is a task row with the columns outbox.TaskInfo leaves out, for
// the console's task page.
type Detail struct {
	outbox.TaskInfo
	// LeaseOwner is the relay or scanner claim that last took the row, 0
	// for none. A confirmed publish leaves it set; the claim holds the row
	// only until NextAttemptAt.
	LeaseOwner int64
	// NextAttemptAt is the claim's expiry while LeaseOwner is set, else
	// when a backed-off publish is tried again; zero when unset.
	NextAttemptAt time.Time
	// PayloadBytes is the payload's size.
	PayloadBytes int
}

// GetByID reads task id with its payload, or returns outbox.ErrNotFound.
func GetByID(ctx context.Context, q outbox.Querier, id int64) (*Detail, error) {
	info, err := scanInfo(q.QueryRowContext(ctx, store.SelectTask+" WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: id %d", outbox.ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: read task %d: %w", id, err)
	}
	d := &Detail{TaskInfo: *info, PayloadBytes: len(info.Task.Payload)}
	var next int64
	err = q.QueryRowContext(ctx, "SELECT lease_owner, next_attempt_ms FROM delay_task WHERE id = ?", id).Scan(&d.LeaseOwner, &next)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: id %d", outbox.ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: read task %d: %w", id, err)
	}
	if next != 0 {
		d.NextAttemptAt = store.MsTime(next)
	}
	return d, nil
}

// LockByID locks task id inside tx and returns its topic and key, so an
// action by id acts on exactly that row; outbox.ErrNotFound when it is gone.
func LockByID(ctx context.Context, tx *sql.Tx, id int64) (topic, key string, err error) {
	var k []byte
	err = tx.QueryRowContext(ctx, "SELECT topic, task_key FROM delay_task WHERE id = ? FOR UPDATE", id).Scan(&topic, &k)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", fmt.Errorf("%w: id %d", outbox.ErrNotFound, id)
	}
	if err != nil {
		return "", "", fmt.Errorf("outbox: lock task %d: %w", id, err)
	}
	return topic, string(k), nil
}

// DueCounts counts pending and published tasks due in each of n equal
// buckets of [from, from+span), each state of a bucket up to capEach: a walk
// of the (state, due_ms) index that stops there, so its cost is bounded
// however many tasks wait (a sale's millions). capped reports that some
// bucket reached the bound: its count is a floor.
func DueCounts(ctx context.Context, q outbox.Querier, from time.Time, span time.Duration, n, capEach int) (counts []int, capped bool, err error) {
	if n <= 0 || span <= 0 || capEach <= 0 {
		return nil, false, fmt.Errorf("outbox: due counts: %d buckets over %v, up to %d each", n, span, capEach)
	}
	width := max(1, span.Milliseconds()/int64(n))
	lo := from.UnixMilli()
	counts = make([]int, n)
	for b := range n {
		for _, st := range []outbox.State{outbox.StatePending, outbox.StatePublished} {
			var c int
			if err := q.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT 1 FROM delay_task FORCE INDEX (ix_delay_task_state_due)
WHERE state = ? AND due_ms >= ? AND due_ms < ? LIMIT ?) t`, string(st), lo+width*int64(b), lo+width*int64(b+1), capEach).Scan(&c); err != nil {
				return nil, false, fmt.Errorf("outbox: due counts: %w", err)
			}
			counts[b] += c
			capped = capped || c == capEach
		}
	}
	return counts, capped, nil
}

// LatenessSamplesPerBucket bounds the done tasks each LatenessSeries bucket
// reads, the newest due first: each is a primary-key lookup.
const LatenessSamplesPerBucket = 500

// LatenessSeries summarises the lateness of done tasks due in each of n
// equal buckets of [to−span, to), from at most LatenessSamplesPerBucket
// tasks a bucket.
func LatenessSeries(ctx context.Context, q outbox.Querier, to time.Time, span time.Duration, n int) ([]Lateness, error) {
	if n <= 0 || span <= 0 {
		return nil, fmt.Errorf("outbox: lateness series: %d buckets over %v", n, span)
	}
	width := max(1, span.Milliseconds()/int64(n))
	lo := to.UnixMilli() - width*int64(n)
	out := make([]Lateness, n)
	for b := range n {
		rows, err := q.QueryContext(ctx, `SELECT done_ms - due_ms FROM delay_task FORCE INDEX (ix_delay_task_state_due)
WHERE state = 'done' AND due_ms >= ? AND due_ms < ? AND done_ms <> 0 ORDER BY due_ms DESC LIMIT ?`,
			lo+width*int64(b), lo+width*int64(b+1), LatenessSamplesPerBucket)
		if err != nil {
			return nil, fmt.Errorf("outbox: lateness series: %w", err)
		}
		var ms []int64
		for rows.Next() {
			var l int64
			if err := rows.Scan(&l); err != nil {
				rows.Close()
				return nil, fmt.Errorf("outbox: lateness series: %w", err)
			}
			ms = append(ms, l)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("outbox: lateness series: %w", err)
		}
		if err := rows.Close(); err != nil {
			return nil, fmt.Errorf("outbox: lateness series: %w", err)
		}
		out[b] = summarize(ms)
	}
	return out, nil
}

// RescueSample says how many tasks of a sample the scanner had to publish
// again.
type RescueSample struct {
	// Sampled is how many tasks were looked at.
	Sampled int `json:"sampled"`
	// Rescued is how many of them were rescued at least once.
	Rescued int `json:"rescued"`
	// Rescues adds up their rescues.
	Rescues int `json:"rescues"`
}

// rescueSample bounds the rows each Rescues sample reads.
const rescueSample = 5000

// Rescues samples the scanner's work at a bounded cost: among the done
// tasks due in [now−window, now), the newest rescueSample, and among the
// published tasks, the rescueSample due first.
func Rescues(ctx context.Context, q outbox.Querier, now time.Time, window time.Duration) (done, published RescueSample, err error) {
	read := func(query string, args ...any) (RescueSample, error) {
		var r RescueSample
		if err := q.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(rescues > 0), 0), COALESCE(SUM(rescues), 0) FROM (`+query+`) t`, args...).
			Scan(&r.Sampled, &r.Rescued, &r.Rescues); err != nil {
			return r, fmt.Errorf("outbox: rescues: %w", err)
		}
		return r, nil
	}
	done, err = read(`SELECT rescues FROM delay_task FORCE INDEX (ix_delay_task_state_due) WHERE state = 'done' AND due_ms >= ? AND due_ms < ? ORDER BY due_ms DESC LIMIT ?`,
		now.Add(-window).UnixMilli(), now.UnixMilli(), rescueSample)
	if err != nil {
		return
	}
	published, err = read(`SELECT rescues FROM delay_task FORCE INDEX (ix_delay_task_state_due) WHERE state = 'published' ORDER BY due_ms LIMIT ?`, rescueSample)
	return
}

// scanInfo reads a row of store.SelectTask or store.SelectTaskRow.
func scanInfo(s store.Scanner) (*outbox.TaskInfo, error) {
	r, err := store.ScanTask(s)
	if err != nil {
		return nil, err
	}
	t := outbox.Task{Topic: r.Topic, Key: r.Key, DueAt: r.DueAt, Payload: r.Payload, Headers: r.Headers, Trace: r.Trace}
	return &outbox.TaskInfo{ID: r.ID, Task: t, State: outbox.State(r.State), Generation: r.Generation,
		PublishAttempts: r.PublishAttempts, Attempts: r.Attempts, Rescues: r.Rescues, Snoozes: r.Snoozes, LastError: r.LastError,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, PublishedAt: r.PublishedAt, DoneAt: r.DoneAt}, nil
}
