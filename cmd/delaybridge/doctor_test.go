package main

import (
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/rabbit"
)

// doctor warns about a ladder on a RabbitMQ cluster older than 3.12.5 with
// at-least-once dead-lettering, and only then.
func TestClusterDeadLetteringWarning(t *testing.T) {
	for _, c := range []struct {
		version string
		nodes   int
		mode    string
		dl      rabbit.DeadLettering
		warn    bool
	}{
		{"3.10.8", 2, "ladder", rabbit.AtLeastOnce, true},
		{"3.11.28", 2, "ladder", rabbit.AtLeastOnce, true},
		{"3.12.4", 1, "ladder", rabbit.AtLeastOnce, true},
		{"3.12.5", 2, "ladder", rabbit.AtLeastOnce, false},
		{"3.13.0", 2, "ladder", rabbit.AtLeastOnce, false},
		{"4.0.2", 2, "ladder", rabbit.AtLeastOnce, false},
		{"3.10.8", 0, "ladder", rabbit.AtLeastOnce, false},
		{"3.10.8", 2, "ladder", rabbit.AtMostOnce, false},
		{"3.10.8", 2, "delayed-exchange", rabbit.AtLeastOnce, false},
		{"3.12.4+rc.1", 2, "ladder", rabbit.AtLeastOnce, true},
	} {
		got := clusterDeadLetteringWarning(c.version, c.nodes, c.mode, c.dl)
		if (got != "") != c.warn {
			t.Errorf("%s, %d other nodes, %s, %v: warning %q, want one: %v", c.version, c.nodes, c.mode, c.dl, got, c.warn)
		}
		if got != "" && !strings.Contains(got, "--rabbit-dead-lettering at-most-once") {
			t.Errorf("warning %q does not say what to set", got)
		}
	}
}
