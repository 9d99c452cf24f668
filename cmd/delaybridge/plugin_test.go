package main

import (
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestDemo_HoldsItsInvariantsInDelayedExchangeMode(t *testing.T) {
	testenv.DelayedPlugin(t)
	_, dsn := testenv.ScratchDB(t)
	out := mustRun(t, append([]string{"demo", "--mysql-dsn", dsn, "--orders", "80", "--timeout", "2s", "--spread", "1s", "--json", "--log-level", "error"},
		append(testenv.RabbitFlags(t), "--rabbit-mode", "delayed-exchange")...)...)
	m := lastJSON(t, out)
	if m["broker"] != "rabbit" || m["mode"] != "delayed-exchange" || m["orders"] != 80.0 || m["wrongly_cancelled"] != 0.0 || m["left_unpaid"] != 0.0 || m["early"] != 0.0 ||
		m["stock_ok"] != true || m["paid"].(float64)+m["cancelled"].(float64) != 80 {
		t.Fatalf("demo summary %v", m)
	}
}

func TestDoctor_DelayedExchangeModeSaysWhatThePluginDoesNotPromise(t *testing.T) {
	testenv.DelayedPlugin(t)
	dsn := scratch(t)
	out := mustRun(t, append([]string{"doctor", "--mysql-dsn", dsn}, append(testenv.RabbitFlags(t), "--rabbit-mode", "delayed-exchange")...)...)
	for _, want := range []string{"OK    delayed-message plugin present: delayed-exchange mode works", "WARN  delayed-exchange mode: the plugin keeps waiting messages in a Mnesia table on one node, not replicated",
		"WARN  delayed-exchange mode: the plugin routes a message only when it is due, so publishing cannot ask for mandatory returns",
		"WARN  delayed-exchange mode is deprecated: the delayed-message plugin was archived upstream", "delivered early", "0 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
	out = mustRun(t, append([]string{"doctor", "--mysql-dsn", dsn}, testenv.RabbitFlags(t)...)...)
	if !strings.Contains(out, "OK    delayed-message plugin present (delayed-exchange mode possible; ladder mode needs no plugin)") || strings.Contains(out, "Mnesia") || strings.Contains(out, "deprecated") {
		t.Errorf("doctor in ladder mode:\n%s", out)
	}
}
