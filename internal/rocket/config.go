package rocket

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// Config configures a Publisher and a Subscriber. Every zero value means the
// default stated on the field.
type Config struct {
	// NameServers are the name server addresses, host:port. Required.
	NameServers []string
	// Limits say what one hop may be and select the delay mode. Without
	// Levels the publisher sends RocketMQ 5 timer messages (TIMER_DELAY_MS)
	// of at most MaxHop, which ops set to the broker's timerMaxDelaySec, and
	// Precision is the broker's timerPrecisionMs. With Levels it sends
	// RocketMQ 4.x delay levels (the DELAY property), which must equal the
	// broker's messageDelayLevel list. NewPublisher reads the brokers' own
	// settings (ReadBrokerLimits) and uses them for what is unset here: zero
	// Limits become the brokers' timer limits, or their levels when their
	// timer wheel is off; a zero MaxHop or Precision in timer mode becomes
	// theirs. Limits the brokers cannot keep are refused with
	// ErrLimitsExceedBroker, naming both values.
	Limits broker.Limits
	// Lead, in timer mode, is how much earlier than due the last timer hop
	// ends: the broker delivers the message up to Lead plus one
	// timerPrecisionMs early, and the consumer runtime holds it until due.
	// A hop shorter than that skips the timer wheel and goes as a plain
	// message, and the relay publishes only that far ahead (its default
	// lookahead is the lead). So a task's last seconds are never on the
	// wheel: the wheel moves one second's slot into the topics before the
	// next slot, and a burst's slot would keep every later task of every
	// topic waiting (BENCHMARKS.md, "One topic's burst beside another
	// topic"). Default DefaultLead, or half of one hop (MaxHop) when that
	// is shorter; negative means none: the last hop ends
	// one precision before due and the relay's lookahead is
	// DefaultLookahead. Level mode has no lead. A consumer's HoldWindow
	// defaults to twice its publisher's precision, the lead included, so
	// it holds these; one set shorter sends an early message on as one
	// more hop.
	Lead time.Duration
	// TrustLimits skips reading the brokers' settings: Limits are used as
	// given, and zero Limits mean TimerLimits(259200s, 1s), the broker's
	// defaults. For clients not allowed the admin request GET_BROKER_CONFIG.
	TrustLimits bool
	// ProducerGroup names the producer group. Default "delaybridge-producer".
	ProducerGroup string
	// GroupPrefix starts every consumer group name: a subscription to topic
	// T consumes in group GroupPrefix+"-"+T, so every subscriber of T with
	// the same prefix competes for its messages. Default "delaybridge".
	GroupPrefix string
	// SendWorkers bounds the sends one Publisher has in flight to the
	// broker at once. Messages already due, and in timer mode timed
	// messages whose hops end in the same slot of the wheel, go up to 32 in
	// a send; the others go one at a time, many concurrently (see
	// Publisher). Default 64.
	SendWorkers int
	// SendTimeout bounds one send attempt. Default 3s. With several broker
	// groups it is also how long a send already on its way to a broker that
	// dies waits before its retry goes to another group: the client does
	// not fail requests of a connection that closes (see docs/deployment.md).
	SendTimeout time.Duration
	// SendRetries is how many times the client retries a failed send on its
	// own before Publish reports the message as not confirmed. Default 2;
	// negative means no retry. A retry goes to a queue of another broker
	// group than the failed attempt, so with several groups keep at least
	// one: without it, a send to a group that is down fails until the
	// client's next route refresh (every 30 s) drops that group.
	SendRetries int
	// ConsumeGoroutines bounds the deliveries of one subscription that are
	// unsettled at once (each holds a client callback, a parked goroutine,
	// until Ack or Nack). The runtime's group commit handles together what
	// is waiting, so this bounds how large groups get under load, and the
	// messages it holds early count against it too: they arrive up to the
	// lead plus one timerPrecisionMs before due (Lead), about 10 s with
	// the defaults. Above the due rate per topic × those seconds,
	// deliveries wait in the client's queue in the order they were
	// published, and a task published out of order with others may wait
	// behind them. A parked goroutine costs a few KB. Default DefaultConsumeGoroutines,
	// at most MaxConsumeGoroutines.
	ConsumeGoroutines int
	// ConsumeTimeout is how long a delivery may stay unsettled before the
	// client gives it back to the broker on its own. Keep it above the
	// runtime's HandlerTimeout plus its HoldWindow. Default 15m.
	ConsumeTimeout time.Duration
	// AssignWait bounds how long Subscribe waits for the consumer's first
	// rebalance to give it queues. Default 10s.
	AssignWait time.Duration
	// AccessKey and SecretKey are the ACL credentials of a broker with
	// aclEnable=true. The client signs every request with SecretKey
	// (HMAC-SHA1) and sends AccessKey and the signature; SecretKey itself
	// never travels. Both or neither; empty means no ACL.
	AccessKey string
	SecretKey string
	// TLS makes the client talk TLS to the name servers and brokers.
	// rocketmq-client-go does not verify the server's certificate, so this
	// stops eavesdropping, not an active man in the middle; and the client
	// keeps the setting in a process-wide default, so once one client
	// starts with TLS, every later client of the process uses TLS too.
	TLS bool
	// CreateTopics makes a Client on this adapter (New) create, when it
	// starts, the topic of each handler, its group's retry topic and the
	// dead-letter topic on BrokerAddr, with Queues read and write queues.
	// Leave it off where operators create topics (mqadmin updateTopic) or
	// ACL is on.
	CreateTopics bool
	// BrokerAddr is the broker CreateTopics creates topics on.
	BrokerAddr string
	// Queues is the read and write queues of a topic created. Default 8.
	Queues int
	// Logger receives the adapter's logs. Default slog.Default().
	Logger *slog.Logger
}

// Defaults applied to a zero Config.
const (
	// DefaultProducerGroup is Config.ProducerGroup's default.
	DefaultProducerGroup = "delaybridge-producer"
	// DefaultGroupPrefix is Config.GroupPrefix's default.
	DefaultGroupPrefix = "delaybridge"
	// DefaultSendWorkers is Config.SendWorkers' default.
	DefaultSendWorkers = 64
	// DefaultSendTimeout is Config.SendTimeout's default.
	DefaultSendTimeout = 3 * time.Second
	// DefaultSendRetries is Config.SendRetries' default.
	DefaultSendRetries = 2
	// DefaultConsumeGoroutines is Config.ConsumeGoroutines' default. The
	// consumer's group commit needs deliveries waiting: with far fewer in
	// flight it finds one or two at a time and the database handler falls
	// behind under load. RabbitMQ's prefetch plays the same part. With
	// the lead the consumer holds seconds of tasks: at 1,024, tasks due at
	// 5,000 a second waited for a callback up to 138 ms past due; at
	// 8,192 none did (BENCHMARKS.md, "Choosing the lookahead, the lead and
	// what is in flight").
	DefaultConsumeGoroutines = 8192
	// MaxConsumeGoroutines is the most Config.ConsumeGoroutines the
	// client accepts.
	MaxConsumeGoroutines = 100000
	// DefaultConsumeTimeout is Config.ConsumeTimeout's default, the client's.
	DefaultConsumeTimeout = 15 * time.Minute
	// DefaultAssignWait is Config.AssignWait's default.
	DefaultAssignWait = 10 * time.Second
	// DefaultTimerMaxDelay is the broker's default timerMaxDelaySec.
	DefaultTimerMaxDelay = 259200 * time.Second
	// DefaultTimerPrecision is the broker's default timerPrecisionMs.
	DefaultTimerPrecision = time.Second
	// DefaultRelayWorkers is the relay's default number of claim loops on
	// RocketMQ (broker.Limits.RelayWorkers), set on Config.Limits when it
	// has none. A timed send waits for the broker's store, so a loop
	// spends most of a batch waiting on its sends, and with 4 loops the
	// claims and marks between them left the publisher idle; 8 relay
	// faster. RabbitMQ, whose publishes are cheaper, does no better with
	// 8 and keeps the relay's 4. The figures are in docs/tuning.md, "Why
	// these values".
	DefaultRelayWorkers = 8
	// DefaultLead is Config.Lead's default, RabbitMQ's lead too. Ten
	// seconds let the relay publish a burst of 100,000 before it is due
	// instead of while it is handled; at 5,000 due a second and with a
	// burst beside a trickle it did better than 3 s (BENCHMARKS.md,
	// "Choosing the lookahead, the lead and what is in flight"). The
	// consumer holds up to the lead plus a precision of tasks: up to
	// DefaultConsumeGoroutines of them in callbacks, the rest queued in
	// the client in the order they were published.
	DefaultLead = 10 * time.Second
	// DefaultLookahead is the relay's default lookahead on RocketMQ
	// (broker.Limits.Lookahead) in level mode and in timer mode without a
	// lead, set on Config.Limits when it has none. The broker keeps
	// waiting messages on disk, each costing it little memory, so it may
	// hold a minute of work: the relay then publishes ahead of the
	// consumers instead of beside them. With a lead, the lookahead is the
	// lead. Tasks due later wait in the database.
	DefaultLookahead = time.Minute
	// LevelPrecision is how far from its level a delay-level message may
	// arrive: the broker's schedule service polls every 100ms.
	LevelPrecision = 100 * time.Millisecond
)

// TimerLimits returns the limits of RocketMQ 5 timer mode for a broker with
// timerMaxDelaySec = maxDelay and timerPrecisionMs = precision.
// Its Lookahead is left to the Config: the lead, or DefaultLookahead
// without one.
func TimerLimits(maxDelay, precision time.Duration) broker.Limits {
	return broker.Limits{MaxHop: maxDelay, Precision: precision, RelayWorkers: DefaultRelayWorkers}
}

// DefaultLevels returns the broker's default messageDelayLevel list:
// 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h.
func DefaultLevels() []time.Duration {
	return []time.Duration{
		time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 3 * time.Minute, 4 * time.Minute, 5 * time.Minute,
		6 * time.Minute, 7 * time.Minute, 8 * time.Minute, 9 * time.Minute, 10 * time.Minute,
		20 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour,
	}
}

// LevelLimits returns the limits of RocketMQ 4.x level mode for a broker
// whose messageDelayLevel list is levels. maxHop, when not zero, keeps hops
// to the levels at or below it.
func LevelLimits(levels []time.Duration, maxHop time.Duration) broker.Limits {
	return broker.Limits{Levels: levels, MaxHop: maxHop, Precision: LevelPrecision, Lookahead: DefaultLookahead, RelayWorkers: DefaultRelayWorkers}
}

func (c Config) withDefaults() (Config, error) {
	if len(c.NameServers) == 0 {
		return c, errors.New("rocket: Config.NameServers is empty")
	}
	if c.Limits.MaxHop == 0 && len(c.Limits.Levels) == 0 {
		c.Limits.MaxHop = DefaultTimerMaxDelay
		if c.Limits.Precision == 0 {
			c.Limits.Precision = DefaultTimerPrecision
		}
	}
	switch {
	case c.Lead == 0:
		c.Lead = DefaultLead
		if c.Limits.MaxHop > 0 {
			// A short hop (a test broker's) keeps half of it for the wheel.
			c.Lead = min(DefaultLead, (c.Limits.MaxHop / 2).Truncate(time.Millisecond))
		}
	case c.Lead < 0:
		c.Lead = -1
	}
	if lead := c.lead(); lead > 0 && c.Limits.MaxHop > 0 && lead+c.Limits.Precision >= c.Limits.MaxHop {
		return c, fmt.Errorf("rocket: Config.Lead %v plus the precision %v is not shorter than one hop (%v): no timer hop could end before due; lower Lead", lead, c.Limits.Precision, c.Limits.MaxHop)
	}
	if c.Limits.Lookahead == 0 {
		c.Limits.Lookahead = DefaultLookahead
		if lead := c.lead(); lead > 0 {
			c.Limits.Lookahead = max(lead, c.Limits.Precision)
		}
	}
	if c.Limits.RelayWorkers == 0 {
		c.Limits.RelayWorkers = DefaultRelayWorkers
	}
	if err := c.Limits.Validate(); err != nil {
		return c, fmt.Errorf("rocket: %w", err)
	}
	if c.ProducerGroup == "" {
		c.ProducerGroup = DefaultProducerGroup
	}
	if c.GroupPrefix == "" {
		c.GroupPrefix = DefaultGroupPrefix
	}
	// A consumer group is GroupPrefix-topic, and the broker takes group
	// names of at most 255 of [%|A-Za-z0-9_-]: checked here, before a
	// consumer subscribes and is refused topic by topic.
	if n := 255 - 1 - broker.MaxTopicLen; len(c.GroupPrefix) > n || strings.IndexFunc(c.GroupPrefix, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
	}) >= 0 {
		return c, fmt.Errorf("rocket: Config.GroupPrefix %q: want 1 to %d of [A-Za-z0-9_-], so every group GroupPrefix-topic is a name the broker takes", c.GroupPrefix, n)
	}
	if c.SendWorkers <= 0 {
		c.SendWorkers = DefaultSendWorkers
	}
	if c.SendTimeout <= 0 {
		c.SendTimeout = DefaultSendTimeout
	}
	switch {
	case c.SendRetries == 0:
		c.SendRetries = DefaultSendRetries
	case c.SendRetries < 0:
		c.SendRetries = 0
	}
	if c.ConsumeGoroutines <= 0 {
		c.ConsumeGoroutines = DefaultConsumeGoroutines
	}
	if c.ConsumeGoroutines > MaxConsumeGoroutines {
		return c, fmt.Errorf("rocket: Config.ConsumeGoroutines %d: the client takes at most %d", c.ConsumeGoroutines, MaxConsumeGoroutines)
	}
	if c.ConsumeTimeout <= 0 {
		c.ConsumeTimeout = DefaultConsumeTimeout
	}
	if c.AssignWait <= 0 {
		c.AssignWait = DefaultAssignWait
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if (c.AccessKey == "") != (c.SecretKey == "") {
		return c, errors.New("rocket: Config.AccessKey and Config.SecretKey go together")
	}
	return c, nil
}

// lead is the lead the publisher keeps: Config.Lead in timer mode, none in
// level mode or when Lead is negative.
func (c Config) lead() time.Duration {
	if len(c.Limits.Levels) > 0 {
		return 0
	}
	return max(c.Lead, 0)
}

// Lead is the lead a publisher on cfg keeps (Config.Lead after its
// defaults; zero in level mode or when negative). Its Limits().Precision
// is the configured precision plus this lead. The console plans a task's
// hops with it.
func Lead(cfg Config) (time.Duration, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return 0, err
	}
	return cfg.lead(), nil
}

// hopLimits are the limits the publisher plans with and reports
// (Publisher.Limits): in timer mode the lead is added to the precision, so
// the last hop ends a lead and a precision before due, a shorter hop goes
// without delay, and the consumer's HoldWindow (twice the precision)
// covers what arrives early.
func (c Config) hopLimits() broker.Limits {
	l := c.Limits
	l.Precision += c.lead()
	return l
}

// credentials returns the ACL credentials, empty without ACL.
func (c Config) credentials() primitive.Credentials {
	return primitive.Credentials{AccessKey: c.AccessKey, SecretKey: c.SecretKey}
}

// clientOptions returns the connection settings every client of this
// package shares, ACL credentials and TLS, as options of one client kind:
// clientOptions(cfg, producer.WithCredentials, producer.WithTls). TLS is
// only ever switched on: the client keeps it in a process-wide default, and
// switching it off here would turn it off for other clients.
func clientOptions[O any](c Config, withCredentials func(primitive.Credentials) O, withTLS func(bool) O) []O {
	var opts []O
	if cr := c.credentials(); !cr.IsEmpty() {
		opts = append(opts, withCredentials(cr))
	}
	if c.TLS {
		opts = append(opts, withTLS(true))
	}
	return opts
}

// instanceSeq makes every client's instance name unique in the process:
// rocketmq-client-go shares one connection set per instance name, and two
// subscribers of one group in one process must be two consumers to the
// broker, not one.
var instanceSeq atomic.Int64

func instanceName(kind string) string {
	return fmt.Sprintf("delaybridge-%s-%d-%d", kind, time.Now().UnixNano(), instanceSeq.Add(1))
}
