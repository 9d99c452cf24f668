package main

import (
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/internal/rabbit"
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

// doctor warns of the delivery limit RabbitMQ 4 gives quorum queues, and
// says the policy that lifts it for the prefix's queues.
func TestDeliveryLimitWarning(t *testing.T) {
	for version, warn := range map[string]bool{"3.10.8": false, "3.13.7": false, "4.0.5": true, "4.2.0": true, "": false} {
		got := deliveryLimitWarning(version, "shop.eu")
		if (got != "") != warn {
			t.Errorf("%q: warning %q, want one: %v", version, got, warn)
		}
		if got != "" && !strings.Contains(got, `set_policy delaybridge-delivery-limit '^shop\.eu\.q\.' '{"delivery-limit": 1000000}' --apply-to quorum_queues`) {
			t.Errorf("warning %q does not give the policy for the prefix", got)
		}
	}
}

func TestPluginRetirement(t *testing.T) {
	for _, c := range []struct {
		version    string
		delayed    bool
		fail, warn bool
	}{
		{"3.10.8", true, false, true},
		{"4.2.1", true, false, true},
		{"4.3.0", true, true, false},
		{"4.10.0", true, true, false},
		{"5.0.0", true, true, false},
		{"4.3.0", false, false, false},
		{"3.10.8", false, false, false},
	} {
		fail, warn := pluginRetirement(c.version, c.delayed)
		if (fail != "") != c.fail || (warn != "") != c.warn {
			t.Errorf("%s delayed %v: fail %q, warn %q; want fail %v, warn %v", c.version, c.delayed, fail, warn, c.fail, c.warn)
		}
		if msg := fail + warn; msg != "" && (!strings.Contains(msg, "ladder") || !strings.Contains(msg, "docs/brokers.md") || !strings.Contains(msg, c.version)) {
			t.Errorf("%s: %q must name the broker's version, the ladder and docs/brokers.md", c.version, msg)
		}
	}
}
