package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Headers another producer wrote as JSON that is not string to string
// (numbers, nested objects, arrays, null, or no JSON at all) never fail
// dead list, task show or the console's task page, for that row or any
// other.
func TestHeaders_NonStringJSONFailsNoListShowOrPage(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	b := setupConsole(t, false)
	dsn := b.dsn
	cols := map[string]string{
		"k-dead":   `{"tenant":1}`,
		"k-soon-1": `{"tenant":{"id":7,"tags":["a",null]}}`,
		"k-soon-2": `[1,2]`,
		"k-later":  `null`,
		"k-done":   `not json`,
	}
	for key, col := range cols {
		testenv.MustExec(t, b.db, "UPDATE delay_task SET headers = ? WHERE id = ?", col, b.ids[key])
	}
	// Every row dead, so dead list reads each kind of column.
	testenv.MustExec(t, b.db, "UPDATE delay_task SET state = 'dead', last_error = 'boom' WHERE topic = ?", consoleTopic)

	out := mustRun(t, "dead", "list", "--mysql-dsn", dsn)
	if !strings.Contains(out, fmt.Sprintf("%d dead task(s)", len(cols))) {
		t.Errorf("dead list:\n%s", out)
	}
	mustRun(t, "dead", "list", "--json", "--mysql-dsn", dsn)
	for key := range cols {
		if out := mustRun(t, "task", "show", consoleTopic, key, "--mysql-dsn", dsn); !strings.Contains(out, "state:       dead") {
			t.Errorf("task show %s:\n%s", key, out)
		}
		mustRun(t, "task", "show", consoleTopic, key, "--json", "--mysql-dsn", dsn)
		if code, page := b.Get(t, fmt.Sprintf("/tasks/%d", b.ids[key])); code != http.StatusOK {
			t.Errorf("console task page of %s (headers %s): %d\n%s", key, cols[key], code, page)
		}
	}
	if code, page := b.Get(t, "/dead"); code != http.StatusOK {
		t.Errorf("console dead page: %d\n%s", code, page)
	}
}
