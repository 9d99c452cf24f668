package ops_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

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
		args = append(args, fmt.Sprintf("topic-%d", i%3), fmt.Sprintf("key-%04d", i), due, string(ops.States[i%len(ops.States)]), base.UnixMilli(), base.UnixMilli(), i%7)
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
	q     ops.SearchQuery
	index string
} {
	from, to := base.Add(20*time.Second), base.Add(200*time.Second)
	return []struct {
		name  string
		q     ops.SearchQuery
		index string
	}{
		{"everything", ops.SearchQuery{}, "ix_delay_task_state_due"},
		{"topic", ops.SearchQuery{Topic: "topic-1"}, "uk_delay_task_topic_key"},
		{"topic and key prefix", ops.SearchQuery{Topic: "topic-1", KeyPrefix: "key-01"}, "uk_delay_task_topic_key"},
		{"key prefix and state", ops.SearchQuery{Topic: "topic-2", KeyPrefix: "key-0", State: outbox.StateDead}, "uk_delay_task_topic_key"},
		{"topic and state", ops.SearchQuery{Topic: "topic-0", State: outbox.StatePending}, "ix_delay_task_state_due"},
		{"state", ops.SearchQuery{State: outbox.StatePublished}, "ix_delay_task_state_due"},
		{"due window", ops.SearchQuery{DueFrom: from, DueTo: to}, "ix_delay_task_state_due"},
		{"state and due window", ops.SearchQuery{State: outbox.StateDone, DueFrom: from}, "ix_delay_task_state_due"},
		{"topic, state and due window", ops.SearchQuery{Topic: "topic-2", State: outbox.StateDead, DueTo: to}, "ix_delay_task_state_due"},
	}
}

// matches is the reference filter: what a shape's query must return.
func matches(q ops.SearchQuery, i *outbox.TaskInfo) bool {
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
		e := &testenv.Explaining{T: t, DB: b.db}
		page, err := ops.Search(b.ctx, e, sh.q)
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
			if _, err := ops.Search(b.ctx, e, q); err != nil {
				t.Fatalf("%s, page 2: %v", sh.name, err)
			}
		}
		if len(e.Plans) == 0 {
			t.Fatalf("%s: no query explained", sh.name)
		}
		for _, p := range e.Plans {
			if p.Key != sh.index || !slices.Contains([]string{"range", "ref", "eq_ref", "const"}, p.Type) ||
				strings.Contains(p.Extra, "filesort") || strings.Contains(p.Extra, "temporary") {
				t.Errorf("%s: EXPLAIN type=%s key=%s extra=%q; want a range or ref of %s without filesort\n%s", sh.name, p.Type, p.Key, p.Extra, sh.index, p.Query)
			}
			// The topic is in the (state, due_ms) index's entries: checked
			// there, a rare topic costs a walk of entries, not of rows.
			if sh.index == "ix_delay_task_state_due" && sh.q.Topic != "" && !p.Covered && !strings.Contains(p.IndexCond, "topic") {
				t.Errorf("%s: the topic is checked on the rows (index condition %q); want it checked in the index entries\n%s", sh.name, p.IndexCond, p.Query)
			}
		}
	}
}

func TestSearch_PagesThroughEveryMatchOnceInOrder(t *testing.T) {
	b := setup(t)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	loadSearchRows(t, b, 600, base)
	all, err := ops.Search(b.ctx, b.db, ops.SearchQuery{Limit: ops.MaxSearchLimit})
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
		if page, err = ops.Search(b.ctx, b.db, ops.SearchQuery{Limit: ops.MaxSearchLimit, After: page.Next}); err != nil {
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
			page, err := ops.Search(b.ctx, b.db, q)
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
	for name, q := range map[string]ops.SearchQuery{
		"key without topic":     {KeyPrefix: "k"},
		"unknown state":         {State: "running"},
		"window ends first":     {DueFrom: now, DueTo: now.Add(-time.Minute)},
		"key cursor, not hex":   {Topic: "t", After: "k:zz"},
		"id cursor for keys":    {Topic: "t", After: "i:5"},
		"due cursor, bad id":    {After: "d:1:x"},
		"id cursor for a state": {Topic: "t", State: outbox.StateDead, After: "i:5"},
	} {
		if _, err := ops.Search(b.ctx, b.db, q); !errors.Is(err, ops.ErrBadSearch) {
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
		if _, err := b.db.ExecContext(b.ctx, "UPDATE delay_task SET state = ?, done_ms = IF(? = 'done', due_ms + ?, 0), rescues = ? WHERE id = ?",
			string(task.state), string(task.state), task.late, task.resc, id); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
	}
	due, capped, err := ops.DueCounts(b.ctx, b.db, now, time.Hour, 12, 100)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0}; !slices.Equal(due, want) || capped {
		t.Errorf("DueCounts = %v, capped %v; want %v, not capped", due, capped, want)
	}
	// A bucket stops counting at the bound, and says so.
	due, capped, err = ops.DueCounts(b.ctx, b.db, now, time.Hour, 12, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0}; !slices.Equal(due, want) || !capped {
		t.Errorf("DueCounts up to 1 = %v, capped %v; want %v, capped", due, capped, want)
	}
	late, err := ops.LatenessSeries(b.ctx, b.db, now, time.Hour, 12)
	if err != nil {
		t.Fatal(err)
	}
	if late[11].Count != 2 || late[11].Max != 300 || late[1].Count != 1 || late[1].P50 != 5000 || late[5].Count != 0 {
		t.Errorf("LatenessSeries = %+v", late)
	}
	done, published, err := ops.Rescues(b.ctx, b.db, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if done != (ops.RescueSample{Sampled: 3, Rescued: 1, Rescues: 1}) || published != (ops.RescueSample{Sampled: 1, Rescued: 1, Rescues: 2}) {
		t.Errorf("Rescues = %+v, %+v", done, published)
	}
	if _, err := ops.GetByID(b.ctx, b.db, 1<<40); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("GetByID of a missing id: %v", err)
	}
	tx, err := b.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	if _, _, err := ops.LockByID(b.ctx, tx, 1<<40); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("LockByID of a missing id: %v", err)
	}
}
