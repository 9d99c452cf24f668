package delaybridge

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/settings"
	"github.com/delaybridge/delaybridge/outbox"
	"github.com/delaybridge/delaybridge/rabbit"
	"github.com/delaybridge/delaybridge/rocket"
)

// Config is what a Client, and the delaybridge binary, need to reach the
// outbox database and the broker. Each field is a setting with a flag
// (named in its comment), a DELAYBRIDGE_* environment variable and a
// config file name, read by LoadConfig. A zero field takes its value from
// DefaultConfig when a Client is built; the relay (delaybridge run) and
// every consumer must agree on the broker settings, so give them the same
// configuration.
type Config struct {
	// MySQLDSN is the outbox database in go-sql-driver format
	// (--mysql-dsn). parseTime is on unless the DSN says otherwise.
	MySQLDSN string
	// MySQLTLS is the database's TLS client setup (--mysql-tls-*).
	MySQLTLS TLSFiles

	// Broker is "rabbit" or "rocket" (--broker). Default "rabbit".
	Broker string

	// AMQPURL is the RabbitMQ URL, amqps:// for TLS (--amqp-url).
	AMQPURL string
	// AMQPNodes are the other nodes of AMQPURL's RabbitMQ cluster as
	// host:port; they take AMQPURL's credentials, vhost and TLS, and each
	// reconnect moves on to the next node that answers (--amqp-nodes).
	AMQPNodes []string
	// AMQPTLS is RabbitMQ's TLS client setup (--amqp-tls-*).
	AMQPTLS TLSFiles
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

	// SigningKeys signs every message and refuses unsigned deliveries:
	// id:base64secret entries, comma separated, the first signs
	// (--signing-keys; see SECURITY.md).
	SigningKeys string

	// Logger receives the adapters' and the consumer's logs. Default
	// slog.Default().
	Logger *slog.Logger

	// The fields below have no flag: they tune a Client in code.

	// Consumer tunes the consumer runtime a Client runs for its handlers
	// (concurrency, retries, group size, hooks). Its zero value is the
	// runtime's defaults; Logger fills its Logger.
	Consumer broker.ConsumerConfig
	// Relay, when not nil, makes a Client also run the relay in its
	// process with this configuration, for a service that is its own
	// daemon. Leave it nil where delaybridge run is deployed.
	Relay *RelayConfig
	// Scanner, when not nil, makes a Client also run the scanner in its
	// process with this configuration (see Relay).
	Scanner *ScannerConfig
	// Cleaner tunes the cleaner a Client with a Relay runs beside it, as
	// delaybridge run does: it deletes done and cancelled tasks past their
	// retention. The zero value is the cleaner's defaults (a week's
	// retention); Logger fills its Logger.
	Cleaner outbox.CleanerConfig
	// NoCleaner keeps a Client with a Relay from cleaning: set it where
	// another process cleans (delaybridge run) or finished tasks must stay.
	NoCleaner bool
	// Stats tunes the counts refresher a Client with a Relay runs beside
	// it, as delaybridge run does: it recounts tasks by state and topic
	// for status and /metrics. The zero value is the refresher's defaults,
	// with the scanner's grace; Logger fills its Logger.
	Stats outbox.StatsRefresherConfig
	// NoStats keeps a Client with a Relay from recounting.
	NoStats bool
	// Presence tunes the records a Client's consumer and relay keep in
	// the outbox (outbox.Announce): set WarnOnly while rolling a topology change out
	// process by process (docs/topology.md), so a consumer whose prefix,
	// mode or ladder differs from the still-running old ones starts and
	// logs the difference instead of refusing. Logger fills its Logger.
	Presence outbox.PresenceConfig
	// Metrics, when not nil, is fed by the consumer, relay and scanner a
	// Client runs (NewMetrics), beside any hooks set above: the consumer's
	// series (the lateness, hops, retries and dead the dashboard in
	// deploy/grafana shows, and its outcomes and group sizes) come from the
	// service that runs the handlers.
	Metrics *Metrics
}

// DefaultConfig returns the default of every setting: the values the
// flags start from and a Client fills zero fields with.
func DefaultConfig() Config {
	return Config{
		Broker:              "rabbit",
		RabbitMode:          "ladder",
		RabbitPrefix:        rabbit.DefaultPrefix,
		RabbitUnit:          rabbit.DefaultUnit,
		RabbitDepth:         rabbit.DefaultDepth,
		RabbitPrefetch:      rabbit.DefaultPrefetch,
		RabbitMaxLength:     rabbit.DefaultMaxLength,
		RabbitDeadLettering: rabbit.AtLeastOnce.String(),
		RocketNameServers:   "127.0.0.1:9876",
		RocketMode:          "timer",
		RocketLevels:        "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
		RocketGroupPrefix:   rocket.DefaultGroupPrefix,
		RocketBrokerAddr:    "127.0.0.1:10911",
		RocketQueues:        8,

		RocketConsumeGoroutines: rocket.DefaultConsumeGoroutines,
	}
}

// withDefaults fills every zero field from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	fill(&c.Broker, d.Broker)
	fill(&c.RabbitMode, d.RabbitMode)
	fill(&c.RabbitPrefix, d.RabbitPrefix)
	fill(&c.RabbitUnit, d.RabbitUnit)
	fill(&c.RabbitDepth, d.RabbitDepth)
	fill(&c.RabbitPrefetch, d.RabbitPrefetch)
	fill(&c.RabbitMaxLength, d.RabbitMaxLength)
	fill(&c.RabbitDeadLettering, d.RabbitDeadLettering)
	fill(&c.RocketNameServers, d.RocketNameServers)
	fill(&c.RocketMode, d.RocketMode)
	fill(&c.RocketLevels, d.RocketLevels)
	fill(&c.RocketGroupPrefix, d.RocketGroupPrefix)
	fill(&c.RocketBrokerAddr, d.RocketBrokerAddr)
	fill(&c.RocketQueues, d.RocketQueues)
	fill(&c.RocketConsumeGoroutines, d.RocketConsumeGoroutines)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// fill sets *v to def when *v is its type's zero value.
func fill[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// RegisterFlags adds every setting of c to fs as a flag bound to c, with
// c's current values as defaults: the database, the broker, the consumer
// settings and the -file companions of the secret ones.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	settings.RegisterDatabaseFlags(fs, &c.MySQLDSN, c.MySQLTLS.Register)
	c.RegisterBrokerFlags(fs)
	c.RegisterConsumerFlags(fs)
	settings.RegisterSecretFiles(fs)
}

// RegisterBrokerFlags adds the settings every process that talks to the
// broker needs, the relay included. The RegisterConsumerFlags ones are
// apart as only consumers use them.
func (c *Config) RegisterBrokerFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Broker, "broker", c.Broker, "broker adapter: rabbit or rocket")
	fs.StringVar(&c.AMQPURL, "amqp-url", c.AMQPURL, "RabbitMQ URL, amqp:// or amqps:// for TLS")
	fs.StringSliceVar(&c.AMQPNodes, "amqp-nodes", c.AMQPNodes, "other RabbitMQ cluster nodes, host:port,... (failover)")
	fs.StringVar(&c.RabbitMode, "rabbit-mode", c.RabbitMode, "delay mode: ladder or delayed-exchange")
	fs.Var(nonEmpty{&c.RabbitPrefix}, "rabbit-prefix", "exchange and queue name prefix")
	fs.DurationVar(&c.RabbitUnit, "rabbit-unit", c.RabbitUnit, "smallest ladder step, whole milliseconds")
	fs.DurationVar(&c.RabbitLead, "rabbit-lead", c.RabbitLead, "how early the ladder delivers (0 = default, <0 = none)")
	fs.IntVar(&c.RabbitDepth, "rabbit-depth", c.RabbitDepth, "ladder depth: hops reach unit × (2^depth − 1)")
	fs.IntVar(&c.RabbitMaxLength, "rabbit-max-length", c.RabbitMaxLength, "bound on each queue's length (-1 = none)")
	fs.StringVar(&c.RabbitDeadLettering, "rabbit-dead-lettering", c.RabbitDeadLettering, "ladder hops: at-least-once or at-most-once")
	fs.StringVar(&c.RocketNameServers, "rocketmq-namesrv", c.RocketNameServers, "name servers, host:port,...")
	fs.StringVar(&c.RocketMode, "rocketmq-mode", c.RocketMode, "delay mode: timer or levels (4.x delay levels)")
	fs.DurationVar(&c.RocketMaxDelay, "rocketmq-max-delay", c.RocketMaxDelay, "longest timer hop or delay level (0 = the brokers')")
	fs.DurationVar(&c.RocketPrecision, "rocketmq-precision", c.RocketPrecision, "timer precision (0 = the brokers' timerPrecisionMs)")
	fs.StringVar(&c.RocketLevels, "rocketmq-levels", c.RocketLevels, "the broker's messageDelayLevel list (levels mode)")
	fs.StringVar(&c.RocketBrokerAddr, "rocketmq-broker-addr", c.RocketBrokerAddr, "broker to create topics on")
	c.AMQPTLS.Register(fs, "amqp", "RabbitMQ")
	fs.StringVar(&c.RocketAccessKey, "rocketmq-access-key", c.RocketAccessKey, "RocketMQ ACL access key (with --rocketmq-secret-key)")
	fs.StringVar(&c.RocketSecretKey, "rocketmq-secret-key", c.RocketSecretKey, "ACL secret key (prefer --rocketmq-secret-key-file)")
	fs.BoolVar(&c.RocketTLS, "rocketmq-tls", c.RocketTLS, "TLS to RocketMQ, certificates unverified (see SECURITY.md)")
	fs.StringVar(&c.SigningKeys, "signing-keys", c.SigningKeys, "sign and check messages: id:base64secret,... (first signs)")
	settings.RegisterSecretFiles(fs)
}

// RegisterConsumerFlags adds the settings only consumers use: RabbitMQ
// prefetch, RocketMQ consumer groups and topic creation.
func (c *Config) RegisterConsumerFlags(fs *pflag.FlagSet) {
	fs.IntVar(&c.RabbitPrefetch, "rabbit-prefetch", c.RabbitPrefetch, "unacked deliveries per subscription")
	fs.Var(nonEmpty{&c.RocketGroupPrefix}, "rocketmq-group-prefix", "consumer group name prefix")
	fs.IntVar(&c.RocketConsumeGoroutines, "rocketmq-consume-goroutines", c.RocketConsumeGoroutines, "unsettled deliveries per subscription")
	fs.IntVar(&c.RocketQueues, "rocketmq-queues", c.RocketQueues, "read and write queues of each topic created")
	fs.BoolVar(&c.RocketCreateTopics, "rocketmq-create-topics", c.RocketCreateTopics, "consumers create their topics when they start")
}

// nonEmpty is a string flag that refuses "": a setting whose zero value
// means its default in Config would otherwise take an empty flag for the
// default, unannounced (another prefix than the one asked for).
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

// Keyring parses SigningKeys, nil when unset.
func (c Config) Keyring() (broker.Keyring, error) {
	if c.SigningKeys == "" {
		return nil, nil
	}
	ring, err := broker.ParseKeyring(c.SigningKeys)
	if err != nil {
		return nil, fmt.Errorf("--signing-keys: %w", err)
	}
	return ring, nil
}

// Mode names the configured delay mode of the chosen broker.
func (c Config) Mode() string {
	if c.Broker == "rocket" {
		return c.RocketMode
	}
	return c.RabbitMode
}

// RabbitConfig returns the rabbit adapter's configuration.
func (c Config) RabbitConfig() (rabbit.Config, error) {
	cfg := rabbit.Config{URL: c.AMQPURL, Nodes: c.AMQPNodes, Prefix: c.RabbitPrefix, Unit: c.RabbitUnit, Lead: c.RabbitLead, Depth: c.RabbitDepth, Prefetch: c.RabbitPrefetch, MaxLength: c.RabbitMaxLength, Logger: c.Logger}
	if c.AMQPURL == "" {
		return cfg, &settings.NotConfiguredError{Setting: "amqp-url", What: "no RabbitMQ configured"}
	}
	if c.RabbitPrefetch <= 0 || c.RabbitPrefetch > rabbit.MaxPrefetch {
		return cfg, fmt.Errorf("--rabbit-prefetch must be 1 to %d (AMQP's prefetch count is 16 bits), not %d", rabbit.MaxPrefetch, c.RabbitPrefetch)
	}
	if c.RabbitDeadLettering != "" {
		d, err := rabbit.ParseDeadLettering(c.RabbitDeadLettering)
		if err != nil {
			return cfg, fmt.Errorf("--rabbit-dead-lettering: %w", err)
		}
		cfg.DeadLettering = d
	}
	tc, err := c.AMQPTLS.Config("amqp")
	if err != nil {
		return cfg, err
	}
	if tc != nil && !strings.HasPrefix(strings.ToLower(c.AMQPURL), "amqps://") {
		return cfg, fmt.Errorf("--amqp-tls-* flags need an amqps:// --amqp-url, not %s", rabbit.RedactURL(c.AMQPURL))
	}
	cfg.TLS = tc
	switch c.RabbitMode {
	case "ladder":
		cfg.Mode = rabbit.ModeLadder
		if c.RabbitDepth != 0 && (c.RabbitDepth < 1 || c.RabbitDepth > 62) {
			return cfg, fmt.Errorf("--rabbit-depth %d: want 1 to 62 (0 for the default, %d)", c.RabbitDepth, rabbit.DefaultDepth)
		}
		if c.RabbitUnit < 0 || c.RabbitUnit%time.Millisecond != 0 {
			return cfg, fmt.Errorf("--rabbit-unit %v: want a whole number of milliseconds (0 for the default, %v)", c.RabbitUnit, rabbit.DefaultUnit)
		}
	case "delayed-exchange":
		cfg.Mode = rabbit.ModeDelayedExchange
	default:
		return cfg, fmt.Errorf("--rabbit-mode %q: want ladder or delayed-exchange", c.RabbitMode)
	}
	// The adapter's own rules (the URL, the prefix, a ladder whose hops
	// make progress), without connecting.
	if _, err := cfg.Topology(); err != nil {
		return cfg, fmt.Errorf("RabbitMQ settings (--amqp-url, --amqp-nodes, --rabbit-*): %w", err)
	}
	return cfg, nil
}

// RocketConfig returns the rocket adapter's configuration.
func (c Config) RocketConfig() (rocket.Config, error) {
	cfg := rocket.Config{GroupPrefix: c.RocketGroupPrefix, Logger: c.Logger, AccessKey: c.RocketAccessKey, SecretKey: c.RocketSecretKey, TLS: c.RocketTLS,
		ConsumeGoroutines: c.RocketConsumeGoroutines}
	if (c.RocketAccessKey == "") != (c.RocketSecretKey == "") {
		return cfg, fmt.Errorf("--rocketmq-access-key and --rocketmq-secret-key go together")
	}
	for _, s := range strings.Split(c.RocketNameServers, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.NameServers = append(cfg.NameServers, s)
		}
	}
	switch c.RocketMode {
	case "timer":
		if c.RocketMaxDelay < 0 || c.RocketPrecision < 0 {
			return cfg, fmt.Errorf("--rocketmq-max-delay and --rocketmq-precision must not be negative (0 = the broker's)")
		}
		cfg.Limits = rocket.TimerLimits(c.RocketMaxDelay, c.RocketPrecision)
	case "levels":
		lv, err := settings.ParseLevels(c.RocketLevels)
		if err != nil {
			return cfg, err
		}
		cfg.Limits = rocket.LevelLimits(lv, c.RocketMaxDelay)
	default:
		return cfg, fmt.Errorf("--rocketmq-mode %q: want timer or levels", c.RocketMode)
	}
	if err := cfg.Limits.Validate(); err != nil {
		return cfg, err
	}
	if len(cfg.NameServers) == 0 {
		return cfg, &settings.NotConfiguredError{Setting: "rocketmq-namesrv", What: "no RocketMQ name server configured"}
	}
	if c.RocketConsumeGoroutines < 0 || c.RocketConsumeGoroutines > rocket.MaxConsumeGoroutines {
		return cfg, fmt.Errorf("--rocketmq-consume-goroutines %d: want 1 to %d (0 for the default, %d)", c.RocketConsumeGoroutines, rocket.MaxConsumeGoroutines, rocket.DefaultConsumeGoroutines)
	}
	if c.RocketQueues < 0 {
		return cfg, fmt.Errorf("--rocketmq-queues %d: want 1 or more (0 for the default, 8)", c.RocketQueues)
	}
	if _, err := cfg.Topology(); err != nil {
		return cfg, fmt.Errorf("RocketMQ settings (--rocketmq-*): %w", err)
	}
	return cfg, nil
}

// Warnings says what in the broker settings works but is weaker than it
// looks.
func (c Config) Warnings() []string {
	var out []string
	if c.Broker == "rocket" && c.RocketTLS {
		out = append(out, "--rocketmq-tls: the RocketMQ client does not verify the servers' certificates, so TLS stops eavesdropping but not a man in the middle (see SECURITY.md)")
	}
	return out
}

// Check reports bad broker settings without connecting.
func (c Config) Check() error {
	if _, err := c.Keyring(); err != nil {
		return err
	}
	switch c.Broker {
	case "rabbit":
		_, err := c.RabbitConfig()
		return err
	case "rocket":
		_, err := c.RocketConfig()
		return err
	}
	return fmt.Errorf("--broker %q: want rabbit or rocket", c.Broker)
}

// Topology is how these settings meet the broker, as the presence table
// records it (outbox.Announce).
func (c Config) Topology() (broker.Topology, error) {
	switch c.Broker {
	case "rabbit":
		cfg, err := c.RabbitConfig()
		if err != nil {
			return broker.Topology{}, err
		}
		return cfg.Topology()
	case "rocket":
		cfg, err := c.RocketConfig()
		if err != nil {
			return broker.Topology{}, err
		}
		return cfg.Topology()
	}
	return broker.Topology{}, fmt.Errorf("--broker %q: want rabbit or rocket", c.Broker)
}
