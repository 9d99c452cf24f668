package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/outbox"
)

// explaining is a Querier that runs EXPLAIN on every query it passes on, so
// a test can check the plan of the very SQL the console runs.
type explaining struct {
	t     *testing.T
	db    *sql.DB
	plans []plan
}

type plan struct {
	query           string
	typ, key, extra string
	// indexCond is what the server checks in the index entries before it
	// reads a row (EXPLAIN FORMAT=JSON's index_condition), and covered
	// says it reads no row at all (using_index).
	indexCond string
	covered   bool
}

func (e *explaining) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	e.t.Fatalf("a console read wrote: %s", query)
	return nil, nil
}

func (e *explaining) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	e.explain(ctx, query, args)
	return e.db.QueryRowContext(ctx, query, args...)
}

func (e *explaining) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	e.explain(ctx, query, args)
	return e.db.QueryContext(ctx, query, args...)
}

func (e *explaining) explain(ctx context.Context, query string, args []any) {
	e.t.Helper()
	rows, err := e.db.QueryContext(ctx, "EXPLAIN "+query, args...)
	if err != nil {
		e.t.Fatalf("EXPLAIN %s: %v", query, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			e.t.Fatal(err)
		}
		p := plan{query: query}
		for i, c := range cols {
			switch c {
			case "type":
				p.typ = vals[i].String
			case "key":
				p.key = vals[i].String
			case "Extra":
				p.extra = vals[i].String
			}
		}
		e.plans = append(e.plans, p)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	var doc string
	if err := e.db.QueryRowContext(ctx, "EXPLAIN FORMAT=JSON "+query, args...).Scan(&doc); err != nil {
		e.t.Fatalf("EXPLAIN FORMAT=JSON %s: %v", query, err)
	}
	var tree any
	if err := json.Unmarshal([]byte(doc), &tree); err != nil {
		e.t.Fatalf("EXPLAIN FORMAT=JSON: %v", err)
	}
	last := &e.plans[len(e.plans)-1]
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if c, ok := v["index_condition"].(string); ok {
				last.indexCond += c
			}
			if u, ok := v["using_index"].(bool); ok && u {
				last.covered = true
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(tree)
}

// loadSearchRows writes n tasks over three topics and every state, due one
// second apart from base, with a few sharing a due millisecond.
func loadSearchRows(t *testing.T, b *bundle, n int, base time.Time) {
	t.Helper()
	var vals []string
	var args []any
	for i := range n {
		due := base.Add(time.Duration(i) * time.Second).UnixMilli()
		if i%10 == 1 {
			due -= 1000 // the same millisecond as the row before
		}
		vals = append(vals, "(?, ?, ?, '', ?, ?, ?, ?)")
		args = append(args, fmt.Sprintf("topic-%d", i%3), fmt.Sprintf("key-%04d", i), due, string(outbox.States[i%len(outbox.States)]), base.UnixMilli(), base.UnixMilli(), i%7)
	}
	if _, err := b.db.ExecContext(b.ctx, "INSERT INTO delay_task (topic, task_key, due_ms, payload, state, created_ms, updated_ms, rescues) VALUES "+strings.Join(vals, ", "), args...); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.ExecContext(b.ctx, "ANALYZE TABLE delay_task"); err != nil {
		t.Fatal(err)
	}
}

// searchShapes are the filter combinations the console offers, with the
// index each must walk.
func searchShapes(base time.Time) []struct {
	name  string
	q     outbox.SearchQuery
	index string
} {
	from, to := base.Add(20*time.Second), base.Add(200*time.Second)
	return []struct {
		name  string
		q     outbox.SearchQuery
		index string
	}{
		{"everything", outbox.SearchQuery{}, "ix_delay_task_state_due"},
		{"topic", outbox.SearchQuery{Topic: "topic-1"}, "uk_delay_task_topic_key"},
		{"topic and key prefix", outbox.SearchQuery{Topic: "topic-1", KeyPrefix: "key-01"}, "uk_delay_task_topic_key"},
		{"key prefix and state", outbox.SearchQuery{Topic: "topic-2", KeyPrefix: "key-0", State: outbox.StateDead}, "uk_delay_task_topic_key"},
		{"topic and state", outbox.SearchQuery{Topic: "topic-0", State: outbox.StatePending}, "ix_delay_task_state_due"},
		{"state", outbox.SearchQuery{State: outbox.StatePublished}, "ix_delay_task_state_due"},
		{"due window", outbox.SearchQuery{DueFrom: from, DueTo: to}, "ix_delay_task_state_due"},
		{"state and due window", outbox.SearchQuery{State: outbox.StateDone, DueFrom: from}, "ix_delay_task_state_due"},
		{"topic, state and due window", outbox.SearchQuery{Topic: "topic-2", State: outbox.StateDead, DueTo: to}, "ix_delay_task_state_due"},
	}
}

// matches is the reference filter: what a shape's query must return.
func matches(q outbox.SearchQuery, i *outbox.TaskInfo) bool {
	return (q.Topic == "" || i.Task.Topic == q.Topic) &&
		strings.HasPrefix(i.Task.Key, q.KeyPrefix) &&
		(q.State == "" || i.State == q.State) &&
		(q.DueFrom.IsZero() || !i.Task.DueAt.Before(q.DueFrom)) &&
		(q.DueTo.IsZero() || i.Task.DueAt.Before(q.DueTo))
}

func TestSearch_EveryShapeWalksAnIndexWithoutSorting(t *testing.T) {
	b := setup(t)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	loadSearchRows(t, b, 600, base)
	for _, sh := range searchShapes(base) {
		e := &explaining{t: t, db: b.db}
		page, err := outbox.Search(b.ctx, e, sh.q)
		if err != nil {
			t.Fatalf("%s: %v", sh.name, err)
		}
		if page.Index != sh.index {
			t.Errorf("%s: walks %s, want %s", sh.name, page.Index, sh.index)
		}
		// A second page, so the cursor's condition is explained too.
		if page.Next != "" {
			q := sh.q
			q.After = page.Next
			if _, err := outbox.Search(b.ctx, e, q); err != nil {
				t.Fatalf("%s, page 2: %v", sh.name, err)
			}
		}
		if len(e.plans) == 0 {
			t.Fatalf("%s: no query explained", sh.name)
		}
		for _, p := range e.plans {
			if p.key != sh.index || !slices.Contains([]string{"range", "ref", "eq_ref", "const"}, p.typ) ||
				strings.Contains(p.extra, "filesort") || strings.Contains(p.extra, "temporary") {
				t.Errorf("%s: EXPLAIN type=%s key=%s extra=%q; want a range or ref of %s without filesort\n%s", sh.name, p.typ, p.key, p.extra, sh.index, p.query)
			}
			// The topic is in the (state, due_ms) index's entries: checked
			// there, a rare topic costs a walk of entries, not of rows.
			if sh.index == "ix_delay_task_state_due" && sh.q.Topic != "" && !p.covered && !strings.Contains(p.indexCond, "topic") {
				t.Errorf("%s: the topic is checked on the rows (index condition %q); want it checked in the index entries\n%s", sh.name, p.indexCond, p.query)
			}
		}
	}
}

func TestSearch_PagesThroughEveryMatchOnceInOrder(t *testing.T) {
	b := setup(t)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	loadSearchRows(t, b, 600, base)
	all, err := outbox.Search(b.ctx, b.db, outbox.SearchQuery{Limit: outbox.MaxSearchLimit})
	if err != nil {
		t.Fatal(err)
	}
	// The reference: every row, read page by page with the largest limit.
	var every []*outbox.TaskInfo
	for page := all; ; {
		every = append(every, page.Tasks...)
		if page.Next == "" {
			break
		}
		if page, err = outbox.Search(b.ctx, b.db, outbox.SearchQuery{Limit: outbox.MaxSearchLimit, After: page.Next}); err != nil {
			t.Fatal(err)
		}
	}
	if len(every) != 600 {
		t.Fatalf("listing everything found %d rows, want 600", len(every))
	}
	for _, sh := range searchShapes(base) {
		var want []int64
		for _, i := range every {
			if matches(sh.q, i) {
				want = append(want, i.ID)
			}
		}
		var got []*outbox.TaskInfo
		q := sh.q
		q.Limit = 7
		for pages := 0; ; pages++ {
			page, err := outbox.Search(b.ctx, b.db, q)
			if err != nil {
				t.Fatalf("%s: %v", sh.name, err)
			}
			if len(page.Tasks) > q.Limit || pages > 200 {
				t.Fatalf("%s: page of %d rows, page %d", sh.name, len(page.Tasks), pages)
			}
			got = append(got, page.Tasks...)
			if page.Next == "" {
				break
			}
			q.After = page.Next
		}
		var ids []int64
		for i, task := range got {
			ids = append(ids, task.ID)
			if !matches(sh.q, task) {
				t.Errorf("%s: row %d (%s/%s %s) does not match", sh.name, task.ID, task.Task.Topic, task.Task.Key, task.State)
			}
			if i > 0 && !inOrder(sh.index, got[i-1], task) {
				t.Errorf("%s: rows %d and %d out of order", sh.name, got[i-1].ID, task.ID)
			}
		}
		if len(want) == 0 {
			t.Fatalf("%s: the data has no match; the test proves nothing", sh.name)
		}
		slices.Sort(ids)
		slices.Sort(want)
		if !slices.Equal(ids, want) {
			t.Errorf("%s: paged %d rows, want %d (duplicates or gaps)", sh.name, len(ids), len(want))
		}
	}
}

// inOrder reports whether a comes before b in the order index serves.
func inOrder(index string, a, b *outbox.TaskInfo) bool {
	switch index {
	case "uk_delay_task_topic_key":
		return a.Task.Key < b.Task.Key
	}
	return a.Task.DueAt.Before(b.Task.DueAt) || a.Task.DueAt.Equal(b.Task.DueAt) && a.ID < b.ID
}

func TestSearch_RefusesWhatNoIndexServesAndBadCursors(t *testing.T) {
	b := setup(t)
	now := time.Now()
	for name, q := range map[string]outbox.SearchQuery{
		"key without topic":     {KeyPrefix: "k"},
		"unknown state":         {State: "running"},
		"window ends first":     {DueFrom: now, DueTo: now.Add(-time.Minute)},
		"key cursor, not hex":   {Topic: "t", After: "k:zz"},
		"id cursor for keys":    {Topic: "t", After: "i:5"},
		"due cursor, bad id":    {After: "d:1:x"},
		"id cursor for a state": {Topic: "t", State: outbox.StateDead, After: "i:5"},
	} {
		if _, err := outbox.Search(b.ctx, b.db, q); !errors.Is(err, outbox.ErrBadSearch) {
			t.Errorf("%s: err %v, want ErrBadSearch", name, err)
		}
	}
}

func TestConsoleReads_CountDueLatenessAndRescues(t *testing.T) {
	b := setup(t)
	now := time.Now()
	for i, task := range []struct {
		key   string
		due   time.Duration
		state outbox.State
		late  int64
		resc  int
	}{
		{"p1", 2 * time.Minute, outbox.StatePending, 0, 0},
		{"p2", 3 * time.Minute, outbox.StatePending, 0, 0},
		{"p3", 31 * time.Minute, outbox.StatePublished, 0, 2},
		{"p4", 2 * time.Hour, outbox.StatePending, 0, 0},
		{"d1", -2 * time.Minute, outbox.StateDone, 100, 0},
		{"d2", -3 * time.Minute, outbox.StateDone, 300, 1},
		{"d3", -52 * time.Minute, outbox.StateDone, 5000, 0},
	} {
		id := b.schedule(t, outbox.Task{Topic: "reads", Key: task.key, DueAt: now.Add(task.due)})
		due := now.Add(task.due).UnixMilli()
		if _, err := b.db.ExecContext(b.ctx, "UPDATE delay_task SET state = ?, done_ms = IF(? = 'done', ? + ?, 0), rescues = ? WHERE id = ?",
			string(task.state), string(task.state), due, task.late, task.resc, id); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
	}
	due, err := outbox.DueCounts(b.ctx, b.db, now, time.Hour, 12)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0}; !slices.Equal(due, want) {
		t.Errorf("DueCounts = %v, want %v", due, want)
	}
	late, err := outbox.LatenessSeries(b.ctx, b.db, now, time.Hour, 12)
	if err != nil {
		t.Fatal(err)
	}
	if late[11].Count != 2 || late[11].Max != 300 || late[1].Count != 1 || late[1].P50 != 5000 || late[5].Count != 0 {
		t.Errorf("LatenessSeries = %+v", late)
	}
	done, published, err := outbox.Rescues(b.ctx, b.db, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if done != (outbox.RescueSample{Sampled: 3, Rescued: 1, Rescues: 1}) || published != (outbox.RescueSample{Sampled: 1, Rescued: 1, Rescues: 2}) {
		t.Errorf("Rescues = %+v, %+v", done, published)
	}
	if _, err := outbox.GetByID(b.ctx, b.db, 1<<40); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("GetByID of a missing id: %v", err)
	}
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	if _, _, err := outbox.LockByID(b.ctx, tx, 1<<40); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("LockByID of a missing id: %v", err)
	}
}
