package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Whatever a producer wrote into a row's columns, task show and dead list
// print no control character: a terminal escape in the state column
// cannot clear the operator's screen or forge a line.
func TestTaskShow_PrintsNoControlCharacterFromTheRow(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	dsn := scratch(t)
	db := openDSN(t, dsn)
	if _, err := outbox.Schedule(context.Background(), db, outbox.Task{Topic: "esc", Key: "k", DueAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	testenv.MustExec(t, db, "UPDATE delay_task SET state = ?, last_error = ? WHERE topic = 'esc'", "\x1b[2J\x1b[Hdone\n", "boom\x1b[1A\rdone: ok\x07")
	outs := []string{mustRun(t, "task", "show", "esc", "k", "--mysql-dsn", dsn)}
	testenv.MustExec(t, db, "UPDATE delay_task SET state = 'dead' WHERE topic = 'esc'")
	outs = append(outs, mustRun(t, "dead", "list", "--mysql-dsn", dsn))
	for _, out := range outs {
		if strings.ContainsAny(out, "\x1b\r\x07") {
			t.Errorf("the output holds a control character of the row:\n%q", out)
		}
	}
	if !strings.Contains(outs[0], `state:       "\x1b[2J\x1b[Hdone\n"`) {
		t.Errorf("task show does not show the state escaped:\n%s", outs[0])
	}
}
