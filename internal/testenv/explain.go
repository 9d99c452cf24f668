package testenv

import (
	"context"
	"database/sql"
	"encoding/json"
	"testing"
)

// Explaining is a querier that runs EXPLAIN on every query it passes on, so
// a test can check the plan of the very SQL the code runs. A write fails
// the test.
type Explaining struct {
	T     testing.TB
	DB    *sql.DB
	Plans []Plan
}

// Plan is one row of EXPLAIN.
type Plan struct {
	Query            string
	Type, Key, Extra string
	// IndexCond is what the server checks in the index entries before it
	// reads a row (EXPLAIN FORMAT=JSON's index_condition), and covered
	// says it reads no row at all (using_index).
	IndexCond string
	Covered   bool
}

func (e *Explaining) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	e.T.Fatalf("a read wrote: %s", query)
	return nil, nil
}

func (e *Explaining) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	e.Explain(ctx, query, args)
	return e.DB.QueryRowContext(ctx, query, args...)
}

func (e *Explaining) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	e.Explain(ctx, query, args)
	return e.DB.QueryContext(ctx, query, args...)
}

// Explain runs EXPLAIN, then EXPLAIN FORMAT=JSON, of query and adds its plans.
func (e *Explaining) Explain(ctx context.Context, query string, args []any) {
	e.T.Helper()
	rows, err := e.DB.QueryContext(ctx, "EXPLAIN "+query, args...)
	if err != nil {
		e.T.Fatalf("EXPLAIN %s: %v", query, err)
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
			e.T.Fatal(err)
		}
		p := Plan{Query: query}
		for i, c := range cols {
			switch c {
			case "type":
				p.Type = vals[i].String
			case "key":
				p.Key = vals[i].String
			case "Extra":
				p.Extra = vals[i].String
			}
		}
		e.Plans = append(e.Plans, p)
	}
	if err := rows.Err(); err != nil {
		e.T.Fatal(err)
	}
	var doc string
	if err := e.DB.QueryRowContext(ctx, "EXPLAIN FORMAT=JSON "+query, args...).Scan(&doc); err != nil {
		e.T.Fatalf("EXPLAIN FORMAT=JSON %s: %v", query, err)
	}
	var tree any
	if err := json.Unmarshal([]byte(doc), &tree); err != nil {
		e.T.Fatalf("EXPLAIN FORMAT=JSON: %v", err)
	}
	last := &e.Plans[len(e.Plans)-1]
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if c, ok := v["index_condition"].(string); ok {
				last.IndexCond += c
			}
			if u, ok := v["using_index"].(bool); ok && u {
				last.Covered = true
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
