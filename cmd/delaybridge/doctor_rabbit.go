package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/rabbit"
)

func checkRabbit(ctx context.Context, a *app, bf *brokerFlags, r *report) {
	cfg, err := bf.rabbitConfig(a)
	if err != nil {
		r.fail("rabbit: %v", err)
		return
	}
	// Settings the adapter refuses (a malformed URL) are not an unreachable
	// broker: say so as run would.
	if _, err := cfg.Limits(); err != nil {
		r.fail("RabbitMQ settings: %v", scrub(err, bf.AMQPURL))
		return
	}
	in, err := rabbit.Inspect(ctx, cfg)
	if err != nil {
		r.fail("RabbitMQ at %s unreachable: %v", rabbit.RedactURL(bf.AMQPURL), scrub(err, bf.AMQPURL))
		return
	}
	if in.TLS != 0 {
		r.ok("RabbitMQ connection uses %s", tls.VersionName(in.TLS))
	} else if u, err := url.Parse(bf.AMQPURL); err == nil && !isLoopback(u.Hostname()) {
		r.warn("RabbitMQ connection to %s is not encrypted: use an amqps:// URL (see SECURITY.md)", u.Host)
	}
	version := in.Version
	if major, minor := versionOf(version); major > 3 || (major == 3 && minor >= 10) {
		r.ok("RabbitMQ %s (3.10+ has at-least-once dead-lettering)", version)
	} else {
		r.fail("RabbitMQ %s is older than 3.10: the ladder needs quorum queues with at-least-once dead-lettering", version)
	}
	if w := clusterDeadLetteringWarning(version, len(bf.AMQPNodes), bf.RabbitMode, cfg.DeadLettering); w != "" {
		r.warn("%s", w)
	}
	if w := deliveryLimitWarning(version, cfg.Prefix); w != "" {
		r.warn("%s", w)
	}
	if err := in.QuorumDeadLettering; err != nil {
		r.fail("cannot declare a quorum queue with at-least-once dead-lettering: %v (enable the quorum_queue feature flag)", err)
	} else {
		r.ok("quorum queues with at-least-once dead-lettering work")
	}
	switch fail, warn := pluginRetirement(version, cfg.Mode == rabbit.ModeDelayedExchange); {
	case fail != "":
		r.fail("%s", fail)
		return
	case warn != "":
		r.warn("%s", warn)
	}
	checkRabbitPlugin(ctx, bf, cfg, r)
	if cfg.Mode != rabbit.ModeLadder {
		return
	}
	switch depth := in.Depth; {
	case in.LevelsMissing == depth:
		r.warn("no ladder under prefix %q yet: the first publisher declares it", cfg.Prefix)
	case in.LevelsMissing > 0:
		r.fail("ladder under prefix %q is incomplete: %d of %d level queues missing", cfg.Prefix, in.LevelsMissing, depth)
	case in.ExtraLevel:
		r.fail("ladder under prefix %q is deeper than --rabbit-depth %d: was it declared with other settings?", cfg.Prefix, depth)
	default:
		r.ok("ladder under prefix %q has its %d levels: one hop covers %v", cfg.Prefix, depth, rabbit.LadderMaxHop(bf.RabbitUnit, depth))
	}
	r.ok("clock skew with RabbitMQ: not measurable over AMQP (the ladder's TTLs use the broker's clock only for durations)")
}

// clusterDeadLetteringWarning says when a ladder on a RabbitMQ cluster will
// stall after losing a node: before 3.12.5 a level's dead-letter worker
// that reaches its target queue before it elected a new leader keeps
// asking the dead node (docs/deployment.md), and at-least-once
// dead-lettering then holds those hops until the node returns. Empty when
// it does not apply: one node, delayed-exchange mode, at-most-once, or a
// fixed version.
func clusterDeadLetteringWarning(version string, otherNodes int, mode string, dl rabbit.DeadLettering) string {
	if otherNodes == 0 || mode != "ladder" || dl != rabbit.AtLeastOnce {
		return ""
	}
	major, minor := versionOf(version)
	patch := 0
	if parts := strings.SplitN(version, ".", 3); len(parts) == 3 {
		digits := strings.TrimRightFunc(parts[2], func(r rune) bool { return r < '0' || r > '9' })
		patch, _ = strconv.Atoi(digits)
	}
	if major > 3 || major == 3 && (minor > 12 || minor == 12 && patch >= 5) {
		return ""
	}
	return fmt.Sprintf("RabbitMQ %s cluster with at-least-once dead-lettering: after a node is lost, ladder hops can stall until it returns (a RabbitMQ bug fixed in 3.12.5), so those tasks wait for the scanner's --grace; upgrade RabbitMQ or set --rabbit-dead-lettering at-most-once on every process (docs/deployment.md)", version)
}

// deliveryLimitWarning says when the broker's quorum queues have a
// delivery limit of their own (RabbitMQ 4.0 and later: 20 by default): a
// message given back that many times is dropped (the topic queues have no
// dead-letter exchange), and the consumer gives messages back while it
// cannot settle them, through a database outage for one. The scanner
// publishes the task again after its grace, so it is late, not lost; a
// message with no task (foreign, malformed) is lost without a dead record.
// The broker's policies are out of AMQP's sight, so doctor cannot tell
// whether one already raised the limit.
func deliveryLimitWarning(version, prefix string) string {
	if major, _ := versionOf(version); major < 4 {
		return ""
	}
	return fmt.Sprintf("RabbitMQ %s drops a quorum queue's message after 20 deliveries unless a policy raises delivery-limit: a consumer gives a message back every second while it cannot settle it (a retry it cannot publish, a dead letter it cannot record), and those tasks then come back only through the scanner's --grace; unless you did already, run rabbitmqctl set_policy delaybridge-delivery-limit '^%s\\.q\\.' '{\"delivery-limit\": 1000000}' --apply-to quorum_queues (docs/brokers.md)",
		version, regexp.QuoteMeta(prefix))
}

// pluginRetirement says what delayed-exchange mode faces on a broker of
// version: the plugin was archived upstream in January 2026 and keeps its
// messages in Mnesia, which RabbitMQ 4.3 removes, so there the mode
// cannot run (fail); before it, the mode runs but is on its way out
// (warn). Nothing in ladder mode.
func pluginRetirement(version string, delayed bool) (fail, warn string) {
	if !delayed {
		return "", ""
	}
	if major, minor := versionOf(version); major > 4 || major == 4 && minor >= 3 {
		return fmt.Sprintf("delayed-exchange mode cannot run on RabbitMQ %s: 4.3 removed Mnesia, where the delayed-message plugin keeps its messages; use --rabbit-mode ladder (docs/brokers.md, Moving to the ladder)", version), ""
	}
	return "", fmt.Sprintf("delayed-exchange mode is deprecated: the delayed-message plugin was archived upstream in January 2026 and cannot run on RabbitMQ 4.3 or later (this broker is %s); the ladder is the supported mode: move to it as docs/brokers.md says (Moving to the ladder)", version)
}

func versionOf(v string) (int, int) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0
	}
	a, _ := strconv.Atoi(parts[0])
	b, _ := strconv.Atoi(parts[1])
	return a, b
}

// checkRabbitPlugin reports whether the delayed-message plugin is there and,
// in delayed-exchange mode, what it does not promise.
func checkRabbitPlugin(ctx context.Context, bf *brokerFlags, cfg rabbit.Config, r *report) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	present, err := rabbit.PluginPresent(cctx, cfg)
	delayed := bf.RabbitMode == "delayed-exchange"
	switch {
	case err != nil:
		r.fail("cannot tell whether the delayed-message plugin is present: %v", scrub(err, bf.AMQPURL))
		return
	case !present && delayed:
		r.fail("delayed-message plugin missing but --rabbit-mode delayed-exchange is set: enable rabbitmq_delayed_message_exchange or use --rabbit-mode ladder")
		return
	case !present:
		r.ok("delayed-message plugin absent (not needed in ladder mode)")
		return
	case !delayed:
		r.ok("delayed-message plugin present (delayed-exchange mode possible; ladder mode needs no plugin)")
		return
	}
	r.ok("delayed-message plugin present: delayed-exchange mode works; one hop is at most %v, longer delays hop", rabbit.MaxDelayedExchangeHop)
	r.warn("delayed-exchange mode: the plugin keeps waiting messages in a Mnesia table on one node, not replicated; a lost node loses them and the scanner publishes them again after --grace (the ladder's quorum queues are replicated)")
	r.warn("delayed-exchange mode: the plugin routes a message only when it is due, so publishing cannot ask for mandatory returns; a message whose topic queue is gone is dropped silently and only the scanner notices")
	r.warn("delayed-exchange mode: the plugin's own issues report messages delivered early with over 100,000 waiting and gigabytes of memory to hold millions; the ladder (--rabbit-mode ladder) has none of these limits")
}
