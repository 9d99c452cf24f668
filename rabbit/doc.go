// Package rabbit is the RabbitMQ adapter: a Publisher with pipelined
// confirms and a Subscriber with manual acks and reconnect, delaying messages
// either through a plugin-free ladder of quorum queues (the default) or the
// x-delayed-message exchange when that plugin is installed and chosen.
//
// # Ladder mode (default)
//
// RabbitMQ has no native delays. Per-message TTL suffers head-of-line
// blocking, and the delayed-message plugin keeps its messages in one node's
// Mnesia table, unreplicated. The ladder instead uses Depth quorum queues,
// level k holding every message for one queue-wide TTL of Unit × 2^k, so
// expiry order is arrival order. A delay of n units enters at the level of
// n's highest set bit and is dead-lettered (at-least-once dead-lettering
// with reject-publish overflow: lossless on RabbitMQ 3.10+)
// down through the levels of its other set bits, then into the topic's
// queue <prefix>.q.<topic>. See ladder.go for the routing.
//
// With the defaults, Unit 100ms and Depth 26, one hop covers
// (2^26 − 1) × 100ms ≈ 77 days 16 hours; the top level's TTL, 2^25 × 100ms
// ≈ 38.8 days, stays under the 2^32 − 1 ms RabbitMQ documents as a TTL's
// limit (Config rejects a ladder past it). Longer delays
// hop: Limits().MaxHop is the ladder's top and the consumer runtime
// publishes an early message again. Each hop's delay is rounded down to
// whole units after taking off a Lead (default 200ms), so a message is
// never late by the rounding, and up to Lead of dead-letter latency is spent
// before the due time; it arrives up to Unit + Lead early
// (Limits().Precision) and the runtime holds it in memory until due. Held messages count against the prefetch (default
// 1000), which should exceed the due rate × (Unit + Lead).
//
// The topology, declared idempotently by both Publisher and Subscriber
// under Config.Prefix:
//
//	<prefix>.entry       direct exchange: <prefix>.delay.<k> → that queue; where delayed messages enter
//	<prefix>.delay.<k>   quorum queue, TTL Unit×2^k, DLX <prefix>.ladder.<k−1> (level 0: <prefix>.deliver), x-max-length guard
//	<prefix>.ladder.<k>  headers exchange: dlbl-<k>=1 → <prefix>.delay.<k>; alternate exchange: the next one down
//	<prefix>.deliver     direct exchange: <topic> → <prefix>.q.<topic>; alternate exchange <prefix>.parking
//	<prefix>.parking     fanout exchange → <prefix>.parked, a quorum queue for what no topic queue takes
//	<prefix>.q.<topic>   quorum queue the subscribers of topic consume
//
// Three traps, each with a test: RabbitMQ's x-death, x-first-death-* and
// x-last-death-* headers are never published again (3.10's cycle detection
// would otherwise hold the message); a message no topic queue takes at the
// end of the ladder goes to the parking queue instead of waiting in the
// level's dead-letter worker; and a full ladder queue (x-max-length with
// reject-publish; quorum queues may take one message past the limit) nacks
// the publish, which Publish reports as that message failing with ErrNacked.
//
// The broker moves messages from level to level with one dead-letter worker
// per quorum queue, which keeps dead_letter_worker_consumer_prefetch
// messages unconfirmed (32 by default, about 6.6k messages/s per hop on a
// 2-core box). Raise it in advanced.config, as scripts/rabbitmq does (512):
//
//	{rabbit, [{dead_letter_worker_consumer_prefetch, 512}]}
//
// # Many tasks due per second
//
// Every ladder hop is a dead-letter move inside the broker, and a message
// crosses one level per set bit of its delay in units: at thousands of
// messages a second those moves, not the deliveries, fill RabbitMQ's cores.
// When the outbox relay publishes only rows due within a horizon
// (outbox.RelayConfig.Lookahead, `delaybridge run --lookahead`) no longer than
// Unit, a message's delay rounds down to zero units and it goes straight to
// its topic's queue; the consumer runtime holds it until due. On the 2-core
// test machine, 5,000 tasks due per second for 60 s with the outbox handler
// were handled with p99 lateness 65 ms with Unit 1s and a 1 s horizon, and
// fell minutes behind with the default Unit and no horizon (BENCHMARKS.md).
// The price: the database, not the broker, holds the tasks until their last
// second, so a relay that is down delays them; the consumer holds up to
// rate × (Unit + Lead) early messages, which Prefetch must exceed; and Depth
// must shrink as Unit grows (Config rejects a top level past RabbitMQ's TTL
// limit).
//
// # Envelope
//
// A message carries delaybridge's envelope (topic, key, due time, hop,
// attempt, generation, task id, trace and the task's own headers) packed in
// one AMQP header, delaybridge-env, as a URL query that reads plainly in the
// management UI. RabbitMQ decodes every header at each publish and each
// ladder hop, so one header instead of a dozen takes it less work per
// message. It is the only form: an envelope field sent as an AMQP header of
// its own makes the message malformed (docs/envelope.md).
//
// # Delayed-exchange mode
//
// ModeDelayedExchange declares an x-delayed-message exchange and publishes
// with an x-delay header, hopping past the plugin's 2^32 − 1 ms. Without the
// plugin the broker answers 503 "unknown exchange type"; NewPublisher and
// Subscribe then fail with ErrPluginMissing, which names ladder mode;
// PluginPresent asks a broker beforehand. The mode passes broker/brokertest
// on the real plugin (scripts/services.sh installs it). What the plugin does
// not promise: it keeps delayed messages in a Mnesia table on one node, not
// replicated, so a lost node loses them (the outbox scanner publishes them
// again); mandatory cannot report an unroutable message, which is routed
// only when due; upstream calls it unmaintained and meant for delays of a
// day or two and not for hundreds of thousands of waiting messages. The
// ladder is the default for those reasons.
//
// # Connections
//
// A Publisher owns one connection, named "<ConnectionName> publisher",
// with one confirm-mode channel used by one goroutine; each subscription
// owns a connection named "<ConnectionName> subscriber <topic>". Both
// reconnect with backoff after the broker restarts or drops them. A
// publish unconfirmed when its connection died is reported failed with
// ErrConnectionLost, never confirmed; a delivery whose channel died cannot
// be acked and the broker redelivers it.
package rabbit
