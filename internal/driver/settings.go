// Package driver is the seam between the root package and the broker
// adapters: the flat broker settings the daemon and services share
// (flags, DELAYBRIDGE_*, the config file) and the registry the adapters
// join when they are linked, as database/sql drivers do. The root package
// builds the adapter --broker names from here without importing it, so a
// program on RabbitMQ links no RocketMQ client and the other way round.
package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/settings"
)

// Settings are the broker settings by flag, one field per flag, in the
// weak types flags and environment variables carry. The adapter --broker
// names reads them (Entry.Config).
type Settings struct {
	// Broker is "rabbit" or "rocket" (--broker). Default "rabbit".
	Broker string

	// AMQPURL is the RabbitMQ URL, amqps:// for TLS (--amqp-url).
	AMQPURL string
	// AMQPNodes are the other nodes of AMQPURL's RabbitMQ cluster as
	// host:port; they take AMQPURL's credentials, vhost and TLS, and each
	// reconnect moves on to the next node that answers (--amqp-nodes).
	AMQPNodes []string
	// AMQPTLS is RabbitMQ's TLS client setup (--amqp-tls-*).
	AMQPTLS settings.TLSFiles
	// RabbitMode is "ladder" (no plugin) or "delayed-exchange"
	// (--rabbit-mode). Default "ladder".
	RabbitMode string
	// RabbitPrefix starts every exchange and queue name
	// (--rabbit-prefix). Relay and consumers must use the same one.
	RabbitPrefix string
	// RabbitUnit and RabbitDepth shape the ladder (--rabbit-unit,
	// --rabbit-depth): one hop covers unit × (2^depth − 1).
	RabbitUnit  time.Duration
	RabbitDepth int
	// RabbitLead is how much earlier than due the ladder releases a
	// message, held by the consumer until due (--rabbit-lead); negative
	// means none. Default rabbit.DefaultLead.
	RabbitLead time.Duration
	// RabbitPrefetch is the unacked deliveries each consumer subscription
	// may hold (--rabbit-prefetch; consumers only).
	RabbitPrefetch int
	// RabbitMaxLength is the x-max-length of each ladder and topic queue
	// (--rabbit-max-length); -1 means no bound.
	RabbitMaxLength int
	// RabbitDeadLettering is how the ladder's levels hand an expired
	// message on: "at-least-once" (default) or "at-most-once", for a
	// cluster on RabbitMQ before 3.12.5 (--rabbit-dead-lettering; see
	// rabbit.DeadLettering and docs/deployment.md).
	RabbitDeadLettering string

	// RocketNameServers are the RocketMQ name servers, comma separated
	// host:port (--rocketmq-namesrv).
	RocketNameServers string
	// RocketMode is "timer" (RocketMQ 5) or "levels" (4.x delay levels)
	// (--rocketmq-mode). Default "timer".
	RocketMode string
	// RocketMaxDelay is the longest timer hop, at most the brokers'
	// timerMaxDelaySec (zero: theirs, read at start), or in levels mode
	// the highest level to use (zero: all) (--rocketmq-max-delay).
	RocketMaxDelay time.Duration
	// RocketPrecision is the timer precision, at least the brokers'
	// timerPrecisionMs (zero: theirs, read at start) (--rocketmq-precision).
	RocketPrecision time.Duration
	// RocketLead is how much earlier than due the last timer hop ends,
	// held by the consumer until due (--rocketmq-lead); negative means
	// none. Default rocket.DefaultLead.
	RocketLead time.Duration
	// RocketLevels is the broker's messageDelayLevel list
	// (--rocketmq-levels), read as rocket.ParseLevels reads it; commas may
	// separate the levels too.
	RocketLevels string
	// RocketGroupPrefix starts every consumer group name
	// (--rocketmq-group-prefix; consumers only): topic T is consumed in
	// group <prefix>-T.
	RocketGroupPrefix string
	// RocketBrokerAddr is the broker where topics are created
	// (--rocketmq-broker-addr).
	RocketBrokerAddr string
	// RocketConsumeGoroutines bounds the deliveries one RocketMQ consumer
	// subscription holds unsettled, early ones held until due included
	// (--rocketmq-consume-goroutines; consumers only). Default
	// rocket.DefaultConsumeGoroutines.
	RocketConsumeGoroutines int
	// RocketQueues is the read and write queues of a topic created here
	// (--rocketmq-queues; consumers only).
	RocketQueues int
	// RocketCreateTopics makes a Client create, on start, the topic of
	// each handler, its group's retry topic and the dead-letter topic on
	// RocketBrokerAddr (--rocketmq-create-topics; consumers only). Leave it
	// off where topics are created by operators (mqadmin updateTopic) or
	// where ACL is on.
	RocketCreateTopics bool
	// RocketAccessKey and RocketSecretKey are RocketMQ ACL credentials
	// (--rocketmq-access-key, --rocketmq-secret-key).
	RocketAccessKey string
	RocketSecretKey string
	// RocketTLS talks TLS to RocketMQ, without verifying certificates
	// (--rocketmq-tls; see SECURITY.md).
	RocketTLS bool
}

// RegisterFlags adds the flags of the settings every process shares.
func (s *Settings) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&s.Broker, "broker", s.Broker, "broker adapter: rabbit or rocket")
	fs.StringVar(&s.AMQPURL, "amqp-url", s.AMQPURL, "RabbitMQ URL, amqp:// or amqps:// for TLS")
	fs.StringSliceVar(&s.AMQPNodes, "amqp-nodes", s.AMQPNodes, "other RabbitMQ cluster nodes, host:port,... (failover)")
	fs.StringVar(&s.RabbitMode, "rabbit-mode", s.RabbitMode, "delay mode: ladder or delayed-exchange")
	fs.Var(nonEmpty{&s.RabbitPrefix}, "rabbit-prefix", "exchange and queue name prefix")
	fs.DurationVar(&s.RabbitUnit, "rabbit-unit", s.RabbitUnit, "smallest ladder step, whole milliseconds")
	fs.DurationVar(&s.RabbitLead, "rabbit-lead", s.RabbitLead, "how early the ladder delivers (0 = default, <0 = none)")
	fs.IntVar(&s.RabbitDepth, "rabbit-depth", s.RabbitDepth, "ladder depth: hops reach unit × (2^depth − 1)")
	fs.IntVar(&s.RabbitMaxLength, "rabbit-max-length", s.RabbitMaxLength, "bound on each queue's length (-1 = none)")
	fs.StringVar(&s.RabbitDeadLettering, "rabbit-dead-lettering", s.RabbitDeadLettering, "ladder hops: at-least-once or at-most-once")
	fs.StringVar(&s.RocketNameServers, "rocketmq-namesrv", s.RocketNameServers, "name servers, host:port,...")
	fs.StringVar(&s.RocketMode, "rocketmq-mode", s.RocketMode, "delay mode: timer or levels (4.x delay levels)")
	fs.DurationVar(&s.RocketMaxDelay, "rocketmq-max-delay", s.RocketMaxDelay, "longest timer hop or delay level (0 = the brokers')")
	fs.DurationVar(&s.RocketPrecision, "rocketmq-precision", s.RocketPrecision, "timer precision (0 = the brokers' timerPrecisionMs)")
	fs.DurationVar(&s.RocketLead, "rocketmq-lead", s.RocketLead, "how early the last timer hop ends (0 = default, <0 = none)")
	fs.StringVar(&s.RocketLevels, "rocketmq-levels", s.RocketLevels, "the broker's delay levels")
	fs.StringVar(&s.RocketBrokerAddr, "rocketmq-broker-addr", s.RocketBrokerAddr, "broker to create topics on")
	s.AMQPTLS.Register(fs, "amqp", "RabbitMQ")
	fs.StringVar(&s.RocketAccessKey, "rocketmq-access-key", s.RocketAccessKey, "RocketMQ ACL access key (with --rocketmq-secret-key)")
	fs.StringVar(&s.RocketSecretKey, "rocketmq-secret-key", s.RocketSecretKey, "ACL secret key (prefer --rocketmq-secret-key-file)")
	fs.BoolVar(&s.RocketTLS, "rocketmq-tls", s.RocketTLS, "TLS to RocketMQ, certificates unverified (see SECURITY.md)")
}

// RegisterConsumerFlags adds the flags only consumers read.
func (s *Settings) RegisterConsumerFlags(fs *pflag.FlagSet) {
	fs.IntVar(&s.RabbitPrefetch, "rabbit-prefetch", s.RabbitPrefetch, "unacked deliveries per subscription")
	fs.Var(nonEmpty{&s.RocketGroupPrefix}, "rocketmq-group-prefix", "consumer group name prefix")
	fs.IntVar(&s.RocketConsumeGoroutines, "rocketmq-consume-goroutines", s.RocketConsumeGoroutines, "unsettled deliveries per subscription")
	fs.IntVar(&s.RocketQueues, "rocketmq-queues", s.RocketQueues, "read and write queues of each topic created")
	fs.BoolVar(&s.RocketCreateTopics, "rocketmq-create-topics", s.RocketCreateTopics, "consumers create their topics when they start")
}

// nonEmpty is a string flag that refuses "" (a prefix must name
// something).
type nonEmpty struct{ p *string }

func (s nonEmpty) String() string {
	if s.p == nil {
		return ""
	}
	return *s.p
}

func (s nonEmpty) Set(v string) error {
	if v == "" {
		return errors.New("must not be empty")
	}
	*s.p = v
	return nil
}

func (s nonEmpty) Type() string { return "string" }

// Mode is the configured adapter's delay mode.
func (s Settings) Mode() string {
	if s.Broker == "rocket" {
		return s.RocketMode
	}
	return s.RabbitMode
}

// Warnings says what in the settings works but is weaker than it looks.
func (s Settings) Warnings() []string {
	var out []string
	if s.Broker == "rocket" && s.RocketTLS {
		out = append(out, "--rocketmq-tls: the RocketMQ client does not verify the servers' certificates, so TLS stops eavesdropping but not a man in the middle (see SECURITY.md)")
	}
	return out
}

// Entry is what an adapter registers.
type Entry struct {
	// Defaults sets the adapter's settings to their defaults.
	Defaults func(s *Settings)
	// Config checks the adapter's settings without connecting and returns
	// its own configuration (a rabbit.Config, a rocket.Config), with
	// logger.
	Config func(s *Settings, logger *slog.Logger) (any, error)
	// Adapter builds the adapter from what Config returned.
	Adapter func(cfg any) broker.Adapter
}

var (
	mu      sync.RWMutex
	entries = map[string]Entry{}
)

// known are the adapters of this module, which a program links by
// importing their package.
var known = map[string]string{"rabbit": "github.com/delaybridge/delaybridge/rabbit", "rocket": "github.com/delaybridge/delaybridge/rocket"}

// Register makes an adapter available under name. The adapters call it
// from init; a second registration of a name panics.
func Register(name string, e Entry) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := entries[name]; dup {
		panic("driver: adapter " + name + " registered twice")
	}
	entries[name] = e
}

func lookup(name string) (Entry, error) {
	mu.RLock()
	defer mu.RUnlock()
	if e, ok := entries[name]; ok {
		return e, nil
	}
	if pkg, ok := known[name]; ok {
		return Entry{}, fmt.Errorf("--broker %s: this program does not link that adapter; import %s", name, pkg)
	}
	names := make([]string, 0, len(known))
	for n := range known {
		names = append(names, n)
	}
	sort.Strings(names)
	return Entry{}, fmt.Errorf("--broker %q: want %s or %s", name, names[0], names[1])
}

// Defaults returns the settings' defaults: the values the flags start
// from. An adapter not linked leaves its settings zero.
func Defaults() Settings {
	s := Settings{Broker: "rabbit"}
	mu.RLock()
	defer mu.RUnlock()
	for _, e := range entries {
		e.Defaults(&s)
	}
	return s
}

// Config checks the settings of the adapter s.Broker names and returns its
// own configuration.
func (s *Settings) Config(logger *slog.Logger) (any, error) {
	e, err := lookup(s.Broker)
	if err != nil {
		return nil, err
	}
	return e.Config(s, logger)
}

// Adapter builds the adapter s.Broker names from the settings.
func (s *Settings) Adapter(logger *slog.Logger) (broker.Adapter, error) {
	e, err := lookup(s.Broker)
	if err != nil {
		return nil, err
	}
	cfg, err := e.Config(s, logger)
	if err != nil {
		return nil, err
	}
	return e.Adapter(cfg), nil
}

// CloseLogged closes one client of a connection, logging a failure: Close
// has nowhere to return it, and a broker that refused a clean shutdown is
// worth a line.
func CloseLogged(logger *slog.Logger, name, what string, cl interface{ Close() error }) {
	if err := cl.Close(); err != nil {
		if logger == nil {
			logger = slog.Default()
		}
		logger.Warn("delaybridge: closing the broker "+what+" failed", "broker", name, "err", err)
	}
}

// ConfigOf is Config for a caller that knows the adapter's configuration
// type T; a Settings for another adapter is an error.
func ConfigOf[T any](s *Settings, logger *slog.Logger) (T, error) {
	var zero T
	c, err := s.Config(logger)
	if err != nil {
		return zero, err
	}
	t, ok := c.(T)
	if !ok {
		return zero, fmt.Errorf("--broker %s: its settings are a %T, not a %T", s.Broker, c, zero)
	}
	return t, nil
}

// Keyring parses --signing-keys, nil when unset.
func Keyring(signingKeys string) (broker.Keyring, error) {
	if signingKeys == "" {
		return nil, nil
	}
	ring, err := broker.ParseKeyring(signingKeys)
	if err != nil {
		return nil, fmt.Errorf("--signing-keys: %w", err)
	}
	return ring, nil
}

// Open opens a, its publisher and subscriber signed with signingKeys when
// set. withSub also builds a subscriber.
func Open(ctx context.Context, a broker.Adapter, signingKeys string, logger *slog.Logger, withSub bool) (*broker.Connection, error) {
	ring, err := Keyring(signingKeys)
	if err != nil {
		return nil, err
	}
	conn, err := a.Open(ctx, logger, withSub)
	if err != nil {
		return nil, err
	}
	if ring != nil {
		conn.Publisher = broker.Signed(conn.Publisher, ring)
		if conn.Subscriber != nil {
			conn.Subscriber = broker.Verified(conn.Subscriber, ring)
		}
	}
	return conn, nil
}

// ParseArgs reads args as the flags of every broker setting, from the
// defaults: the settings a command line gives, for tests.
func ParseArgs(args ...string) (*Settings, error) {
	s := Defaults()
	fs := pflag.NewFlagSet("broker", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s.RegisterFlags(fs)
	s.RegisterConsumerFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return &s, nil
}
