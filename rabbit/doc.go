// Package rabbit is the RabbitMQ adapter: New builds it from a Config. It
// publishes with pipelined confirms and consumes with manual acks and
// reconnects, delaying messages
// either through a plugin-free ladder of quorum queues (the default) or the
// x-delayed-message exchange when that plugin is installed and chosen
// (Config.Mode).
//
// # Ladder mode (default)
//
// RabbitMQ has no native delays. Per-message TTL suffers head-of-line
// blocking, and the delayed-message plugin keeps its messages in one node's
// Mnesia table, unreplicated. The ladder instead uses Depth quorum queues,
// level k holding every message for one queue-wide TTL of Unit × 2^k, so
// expiry order is arrival order; a message is dead-lettered down through the
// levels of its delay's set bits, then into its topic's queue, losslessly on
// RabbitMQ 3.10+ (at-least-once dead-lettering; a cluster before 3.12.5
// needs at-most-once, see Config.DeadLettering).
//
// With the defaults, Unit 100ms and Depth 26, one hop covers
// (2^26 − 1) × 100ms ≈ 77 days 16 hours; longer delays hop: Limits().MaxHop
// is the ladder's top and the consumer runtime publishes an early message
// again. Each hop's delay is rounded down to whole units after taking off a
// Lead, so a message is never late by the rounding; it arrives up to
// Unit + Lead early (Limits().Precision) and the runtime holds it in memory
// until due. Held messages count against the Prefetch, which should exceed
// the due rate × (Unit + Lead).
//
// # Delayed-exchange mode
//
// ModeDelayedExchange declares an x-delayed-message exchange and publishes
// with an x-delay header, hopping past the plugin's 2^32 − 1 ms. Without the
// plugin the broker answers 503 "unknown exchange type"; connecting then fails
// with ErrPluginMissing, which names ladder mode; delaybridge doctor asks a
// broker beforehand.
//
// # Choosing a mode
//
// Use the ladder unless you have a reason not to: it needs no plugin, every
// step is a replicated quorum queue, and it carries any delay. Its cost is
// the broker's work per hop, which the defaults avoid for what the relay
// publishes: the relay's lookahead equals Lead, so those messages skip the
// ladder and wait in their topic's queue; only retries and long delays hop.
//
// The delayed exchange moves no message between queues, but the plugin keeps
// delayed messages in a Mnesia table on one node, not replicated, so a lost
// node loses them (the outbox scanner publishes them again); mandatory cannot
// report an unroutable message, which is routed only when due. The plugin
// was archived upstream in January 2026 and cannot run on RabbitMQ 4.3 or
// later, which removed Mnesia: the mode is deprecated, the ladder is the
// supported mode, and docs/brokers.md says how to move a running
// deployment to it.
//
// The exchanges and queues each mode declares, the traps the adapter avoids
// and the broker setting the ladder needs are in docs/topology.md.
//
// # Envelope
//
// A message carries delaybridge's envelope packed in one AMQP header,
// delaybridge-env, as a URL query that reads plainly in the management UI;
// an envelope field sent as a header of its own makes the message malformed
// (docs/envelope.md).
//
// # Connections
//
// The publisher owns one connection per channel, named "<ConnectionName>
// publisher <i>", each with one confirm-mode channel used by one goroutine;
// each subscription owns a connection named "<ConnectionName> subscriber
// <topic>". Both reconnect with backoff after the broker restarts or drops
// them. A publish unconfirmed when its connection died is reported failed
// with ErrConnectionLost, never confirmed; a delivery whose channel died
// cannot be acked and the broker redelivers it.
package rabbit
