package outbox_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/store"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TestMigrate_FixedWidthUpgradesOldRows takes a table back to the shape
// migration 1 made, fills it as the code of that time did (NULL until
// published or done), and checks that migration 2 keeps every row's meaning,
// also when it runs a second time after a crash before it was recorded.
func TestMigrate_FixedWidthUpgradesOldRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	toV1 := func() {
		t.Helper()
		for _, q := range []string{
			`ALTER TABLE delay_task MODIFY state VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  MODIFY published_ms BIGINT NULL, MODIFY done_ms BIGINT NULL`,
			"DELETE FROM delaybridge_migration WHERE version = 2",
		} {
			if _, err := b.db.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
	}
	toV1()
	due := time.Now().Add(time.Hour).UnixMilli()
	if _, err := b.db.Exec(`INSERT INTO delay_task (topic, task_key, due_ms, payload, state, created_ms, updated_ms, published_ms, done_ms) VALUES
  ('t', 'pending', ?, '', 'pending', 1, 1, NULL, NULL),
  ('t', 'published', ?, '', 'published', 1, 1, ?, NULL),
  ('t', 'done', ?, '', 'done', 1, 1, ?, ?)`, due, due, due-5000, due, due-5000, due+40); err != nil {
		t.Fatal(err)
	}

	check := func(round string) {
		t.Helper()
		for _, c := range []struct {
			key             string
			state           outbox.State
			published, done int64
		}{
			{"pending", outbox.StatePending, 0, 0},
			{"published", outbox.StatePublished, due - 5000, 0},
			{"done", outbox.StateDone, due - 5000, due + 40},
		} {
			info, err := outbox.Get(b.ctx, b.db, "t", c.key)
			if err != nil {
				t.Fatalf("%s: Get %s: %v", round, c.key, err)
			}
			if info.State != c.state {
				t.Errorf("%s: %s: state %q, want %q", round, c.key, info.State, c.state)
			}
			if got := msOrZero(info.PublishedAt); got != c.published {
				t.Errorf("%s: %s: published at %d, want %d", round, c.key, got, c.published)
			}
			if got := msOrZero(info.DoneAt); got != c.done {
				t.Errorf("%s: %s: done at %d, want %d", round, c.key, got, c.done)
			}
		}
		var nulls int
		if err := b.db.QueryRow("SELECT COUNT(*) FROM delay_task WHERE published_ms IS NULL OR done_ms IS NULL").Scan(&nulls); err != nil || nulls != 0 {
			t.Errorf("%s: %d rows still NULL (%v)", round, nulls, err)
		}
		var typ, nullable string
		if err := b.db.QueryRow(`SELECT COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'delay_task' AND COLUMN_NAME = 'state'`).Scan(&typ, &nullable); err != nil || typ != "char(16)" || nullable != "NO" {
			t.Errorf("%s: state column %s, nullable %s (%v); want char(16) NOT NULL", round, typ, nullable, err)
		}
	}

	applied, err := outbox.Migrate(b.ctx, b.db)
	if err != nil || !slices.Equal(applied, []int{2}) {
		t.Fatalf("Migrate from version 1 applied %v, err %v; want [2]", applied, err)
	}
	check("first run")

	// A crash after the last statement but before the version was recorded:
	// the whole migration runs again on the new shape.
	migrateAgain(t, b, 2)
	check("second run")
}

// migrateAgain forgets that migration version ran, as a crash after its
// statements and before its record would, and checks that Migrate runs it
// (and only it) again without an error.
func migrateAgain(t *testing.T, b *bundle, version int) {
	t.Helper()
	if _, err := b.db.Exec("DELETE FROM delaybridge_migration WHERE version = ?", version); err != nil {
		t.Fatal(err)
	}
	if applied, err := outbox.Migrate(b.ctx, b.db); err != nil || !slices.Equal(applied, []int{version}) {
		t.Fatalf("Migrate again applied %v, err %v; want [%d]", applied, err, version)
	}
}

// msOrZero is t in epoch milliseconds, and 0 only for the zero time.
func msOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	if t.UnixMilli() == 0 {
		return -1 // the epoch itself: a "not yet" read as a time
	}
	return t.UnixMilli()
}

// TestMigrate_StateDueCoversTopic takes the indexes back to what migration
// 5 left, and checks that migration 6 leaves one (state, due_ms, id, topic)
// index and no (state, topic) one, also when it runs a second time after a
// crash before it was recorded; and that the count by state and topic and
// the relay's claim read that index alone.
func TestMigrate_StateDueCoversTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	indexes := func() map[string]string {
		t.Helper()
		rows, err := b.db.Query(`SELECT index_name, GROUP_CONCAT(column_name ORDER BY seq_in_index) FROM information_schema.statistics
WHERE table_schema = DATABASE() AND table_name = 'delay_task' GROUP BY index_name`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]string{}
		for rows.Next() {
			var name, cols string
			if err := rows.Scan(&name, &cols); err != nil {
				t.Fatal(err)
			}
			out[name] = cols
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	check := func(when string) {
		t.Helper()
		got := indexes()
		if got["ix_delay_task_state_due"] != "state,due_ms,id,topic" {
			t.Errorf("%s: ix_delay_task_state_due is (%s), want (state,due_ms,id,topic)", when, got["ix_delay_task_state_due"])
		}
		if cols, ok := got["ix_delay_task_state_topic"]; ok {
			t.Errorf("%s: ix_delay_task_state_topic (%s) is still there", when, cols)
		}
	}
	for _, q := range []string{
		"ALTER TABLE delay_task DROP INDEX ix_delay_task_state_due, ADD INDEX ix_delay_task_state_due (state, due_ms), ADD INDEX ix_delay_task_state_topic (state, topic)",
		"DELETE FROM delaybridge_migration WHERE version = 6",
	} {
		if _, err := b.db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if applied, err := outbox.Migrate(b.ctx, b.db); err != nil || !slices.Equal(applied, []int{6}) {
		t.Fatalf("Migrate applied %v, err %v; want [6]", applied, err)
	}
	check("first run")
	// A crash after both statements, before the record: the run again
	// finds the old index gone and records the migration.
	migrateAgain(t, b, 6)
	check("second run")

	// The claims as ClaimLeased runs them: from the head of the index and
	// past a resume point.
	spec := store.ClaimSpec{State: store.Pending, DueAtMost: 5, ReadyAtMost: 5, PublishedAtMost: 5, Limit: 10}
	head, headArgs := store.ClaimQuery(spec)
	spec.After = &store.Position{DueMS: 3, ID: 7}
	resumed, resumedArgs := store.ClaimQuery(spec)
	for name, q := range map[string]struct {
		query string
		args  []any
	}{
		"count by state and topic":        {store.CountQuery, nil},
		"relay claim":                     {head, headArgs},
		"relay claim past a resume point": {resumed, resumedArgs},
	} {
		e := &testenv.Explaining{T: t, DB: b.db}
		e.Explain(b.ctx, q.query, q.args)
		typ, key, extra := e.Plans[0].Type, e.Plans[0].Key, e.Plans[0].Extra
		if key != "ix_delay_task_state_due" {
			t.Errorf("%s: EXPLAIN key=%s extra=%q; want ix_delay_task_state_due", name, key, extra)
		}
		if name == "count by state and topic" {
			if !strings.Contains(extra, "Using index") {
				t.Errorf("%s: EXPLAIN extra=%q; want the index alone read (Using index)", name, extra)
			}
			continue
		}
		// A claim reads a range of the index in its order: not the whole
		// index (type index), and no sort of what it read.
		if typ != "range" || strings.Contains(extra, "filesort") {
			t.Errorf("%s: EXPLAIN type=%s extra=%q; want a range of the index in its order, no filesort", name, typ, extra)
		}
	}
}
