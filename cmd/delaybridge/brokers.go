package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/rabbit"
	"github.com/delaybridge/delaybridge/rocket"
)

// DefaultAMQPURL is the local development RabbitMQ that
// scripts/services.sh sets up. Only demo and bench fall back to it.
const DefaultAMQPURL = "amqp://delaybridge:delaybridge@127.0.0.1:5672/"

// brokerFlags are the settings that pick and configure a broker adapter.
type brokerFlags struct {
	kind string

	amqpURL        string
	amqpNodes      []string
	amqpTLS        tlsFlags
	rabbitMode     string
	rabbitPref     string
	rabbitUnit     time.Duration
	rabbitDepth    int
	rabbitPrefetch int
	rabbitSplit    bool
	rabbitMaxLen   int

	namesrv     string
	rocketMode  string
	rocketMax   time.Duration
	rocketPrec  time.Duration
	rocketLvls  string
	rocketGroup string
	rocketAddr  string
	rocketQs    int
	rocketAK    string
	rocketSK    string
	rocketTLS   bool

	signingKeys string
}

func (b *brokerFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&b.kind, "broker", "rabbit", "broker adapter: rabbit or rocket")
	fs.StringVar(&b.amqpURL, "amqp-url", "", "RabbitMQ AMQP URL (amqps:// for TLS); required with --broker rabbit, but demo and bench fall back to the local development RabbitMQ")
	fs.StringSliceVar(&b.amqpNodes, "amqp-nodes", nil, "the other nodes of --amqp-url's RabbitMQ cluster as host:port, comma-separated; they take --amqp-url's credentials, vhost and TLS, and every reconnect moves on to the next node that answers")
	fs.StringVar(&b.rabbitMode, "rabbit-mode", "ladder", "RabbitMQ delay mode: ladder (no plugin, quorum queues) or delayed-exchange (rabbitmq_delayed_message_exchange plugin)")
	fs.StringVar(&b.rabbitPref, "rabbit-prefix", rabbit.DefaultPrefix, "prefix of every RabbitMQ exchange and queue delaybridge declares")
	fs.DurationVar(&b.rabbitUnit, "rabbit-unit", rabbit.DefaultUnit, "ladder unit: the smallest delay step, a whole number of milliseconds")
	fs.IntVar(&b.rabbitDepth, "rabbit-depth", rabbit.DefaultDepth, "ladder depth: one hop covers unit × (2^depth − 1)")
	fs.BoolVar(&b.rabbitSplit, "rabbit-split-envelope", false, "publish the envelope as one AMQP header per field, the form versions before delaybridge-env read: set it on every process while any older one still runs")
	fs.IntVar(&b.rabbitMaxLen, "rabbit-max-length", rabbit.DefaultMaxLength, "x-max-length of each ladder queue and topic queue (a publish over it is nacked and retried later; -1 = no bound); changing it needs the queues deleted first")
	fs.IntVar(&b.rabbitPrefetch, "rabbit-prefetch", rabbit.DefaultPrefetch, "unacked deliveries each consumer subscription may hold, early ones held until due included: keep it above the due rate per second × (unit + 200ms)")
	fs.StringVar(&b.namesrv, "rocketmq-namesrv", "127.0.0.1:9876", "RocketMQ name servers, comma separated host:port")
	fs.StringVar(&b.rocketMode, "rocketmq-mode", "timer", "RocketMQ delay mode: timer (RocketMQ 5 timer messages) or levels (4.x delay levels)")
	fs.DurationVar(&b.rocketMax, "rocketmq-max-delay", 72*time.Hour, "longest timer hop: set it to the broker's timerMaxDelaySec (timer mode), or the highest level to use (levels mode, 0 = all)")
	fs.DurationVar(&b.rocketPrec, "rocketmq-precision", time.Second, "the broker's timerPrecisionMs (timer mode)")
	fs.StringVar(&b.rocketLvls, "rocketmq-levels", "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h", "the broker's messageDelayLevel list (levels mode)")
	fs.StringVar(&b.rocketGroup, "rocketmq-group-prefix", rocket.DefaultGroupPrefix, "prefix of RocketMQ consumer group names")
	fs.StringVar(&b.rocketAddr, "rocketmq-broker-addr", "127.0.0.1:10911", "RocketMQ broker address where demo and bench create their topics")
	fs.IntVar(&b.rocketQs, "rocketmq-queues", 8, "read and write queues of the topics demo and bench create")
	b.amqpTLS.register(fs, "amqp", "RabbitMQ")
	fs.StringVar(&b.rocketAK, "rocketmq-access-key", "", "RocketMQ ACL access key (with --rocketmq-secret-key)")
	fs.StringVar(&b.rocketSK, "rocketmq-secret-key", "", "RocketMQ ACL secret key; prefer --rocketmq-secret-key-file or the environment")
	fs.BoolVar(&b.rocketTLS, "rocketmq-tls", false, "talk TLS to the RocketMQ name servers and brokers; the client does not verify their certificates (see SECURITY.md)")
	fs.StringVar(&b.signingKeys, "signing-keys", "", "sign every message and refuse deliveries not signed by these keys: id:base64secret entries (secret at least 32 bytes), comma separated, the first signs; give every relay and consumer the same keys (see SECURITY.md); prefer --signing-keys-file")
	registerSecretFiles(fs)
}

// keyring parses --signing-keys, nil when unset.
func (b *brokerFlags) keyring() (broker.Keyring, error) {
	if b.signingKeys == "" {
		return nil, nil
	}
	ring, err := broker.ParseKeyring(b.signingKeys)
	if err != nil {
		return nil, fmt.Errorf("--signing-keys: %w", err)
	}
	return ring, nil
}

// sign wraps c's publisher and subscriber in the keyring, when there is one.
func (c *clients) sign(ring broker.Keyring) *clients {
	if ring == nil {
		return c
	}
	c.pub = broker.Signed(c.pub, ring)
	if c.sub != nil {
		c.sub = broker.Verified(c.sub, ring)
	}
	return c
}

// mode names the configured delay mode for reports.
func (b *brokerFlags) mode() string {
	if b.kind == "rocket" {
		return b.rocketMode
	}
	return b.rabbitMode
}

// clients are an opened adapter's publisher and subscriber.
type clients struct {
	pub   broker.Publisher
	sub   broker.Subscriber
	close func()
	// addr is the broker address readiness checks dial.
	addr string
	// ensure creates topics that must exist before a consumer starts; a
	// no-op where the adapter declares them itself.
	ensure func(ctx context.Context, topics ...string) error
}

func parseLevels(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Fields(strings.ReplaceAll(s, ",", " ")) {
		d, err := time.ParseDuration(f)
		if err != nil {
			return nil, fmt.Errorf("--rocketmq-levels: %w", err)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--rocketmq-levels: empty")
	}
	return out, nil
}

func (b *brokerFlags) rabbitConfig(a *app) (rabbit.Config, error) {
	cfg := rabbit.Config{URL: b.amqpURL, Nodes: b.amqpNodes, Prefix: b.rabbitPref, Unit: b.rabbitUnit, Depth: b.rabbitDepth, Prefetch: b.rabbitPrefetch, SplitEnvelope: b.rabbitSplit, MaxLength: b.rabbitMaxLen, Logger: a.log}
	if b.amqpURL == "" {
		return cfg, notConfigured("amqp-url", "no RabbitMQ configured")
	}
	if b.rabbitPrefetch <= 0 {
		return cfg, fmt.Errorf("--rabbit-prefetch must be positive, not %d", b.rabbitPrefetch)
	}
	tc, err := b.amqpTLS.config()
	if err != nil {
		return cfg, err
	}
	if tc != nil && !strings.HasPrefix(strings.ToLower(b.amqpURL), "amqps://") {
		return cfg, fmt.Errorf("--amqp-tls-* flags need an amqps:// --amqp-url, not %s", rabbit.RedactURL(b.amqpURL))
	}
	cfg.TLS = tc
	switch b.rabbitMode {
	case "ladder":
		cfg.Mode = rabbit.ModeLadder
	case "delayed-exchange":
		cfg.Mode = rabbit.ModeDelayedExchange
	default:
		return cfg, fmt.Errorf("--rabbit-mode %q: want ladder or delayed-exchange", b.rabbitMode)
	}
	return cfg, nil
}

func (b *brokerFlags) rocketConfig(a *app) (rocket.Config, error) {
	cfg := rocket.Config{GroupPrefix: b.rocketGroup, Logger: a.log, AccessKey: b.rocketAK, SecretKey: b.rocketSK, TLS: b.rocketTLS}
	if (b.rocketAK == "") != (b.rocketSK == "") {
		return cfg, fmt.Errorf("--rocketmq-access-key and --rocketmq-secret-key go together")
	}
	for _, s := range strings.Split(b.namesrv, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.NameServers = append(cfg.NameServers, s)
		}
	}
	switch b.rocketMode {
	case "timer":
		if b.rocketMax <= 0 {
			return cfg, fmt.Errorf("--rocketmq-max-delay must be positive in timer mode")
		}
		cfg.Limits = rocket.TimerLimits(b.rocketMax, b.rocketPrec)
	case "levels":
		lv, err := parseLevels(b.rocketLvls)
		if err != nil {
			return cfg, err
		}
		cfg.Limits = rocket.LevelLimits(lv, b.rocketMax)
	default:
		return cfg, fmt.Errorf("--rocketmq-mode %q: want timer or levels", b.rocketMode)
	}
	if err := cfg.Limits.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// warnings says what in the broker settings works but is weaker than it
// looks; run, demo and bench log it and doctor reports it.
func (b *brokerFlags) warnings() []string {
	var out []string
	if b.kind == "rocket" && b.rocketTLS {
		out = append(out, "--rocketmq-tls: the RocketMQ client does not verify the servers' certificates, so TLS stops eavesdropping but not a man in the middle (see SECURITY.md)")
	}
	return out
}

// check reports bad broker flags without connecting, so a command can
// refuse them before it touches the database. It logs the warnings first.
func (b *brokerFlags) check(a *app) error {
	for _, w := range b.warnings() {
		a.log.Warn("delaybridge: " + w)
	}
	if _, err := b.keyring(); err != nil {
		return err
	}
	switch b.kind {
	case "rabbit":
		_, err := b.rabbitConfig(a)
		return err
	case "rocket":
		_, err := b.rocketConfig(a)
		return err
	}
	return fmt.Errorf("--broker %q: want rabbit or rocket", b.kind)
}

// open connects the chosen adapter. withSub also builds a subscriber.
func (b *brokerFlags) open(ctx context.Context, a *app, withSub bool) (*clients, error) {
	ring, err := b.keyring()
	if err != nil {
		return nil, err
	}
	c, err := b.openAdapter(ctx, a, withSub)
	if err != nil {
		return nil, err
	}
	return c.sign(ring), nil
}

// openAdapter connects the chosen adapter, unsigned.
func (b *brokerFlags) openAdapter(ctx context.Context, a *app, withSub bool) (*clients, error) {
	switch b.kind {
	case "rabbit":
		cfg, err := b.rabbitConfig(a)
		if err != nil {
			return nil, err
		}
		pub, err := rabbit.NewPublisher(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("rabbit %s: %w", rabbit.RedactURL(b.amqpURL), scrub(err, b.amqpURL))
		}
		c := &clients{pub: pub, close: func() { _ = pub.Close() }, ensure: func(context.Context, ...string) error { return nil }}
		if u, err := url.Parse(b.amqpURL); err == nil {
			port := u.Port()
			if port == "" {
				port = map[bool]string{true: "5671", false: "5672"}[u.Scheme == "amqps"]
			}
			c.addr = net.JoinHostPort(u.Hostname(), port)
		}
		if withSub {
			sub, err := rabbit.NewSubscriber(cfg)
			if err != nil {
				_ = pub.Close()
				return nil, err
			}
			c.sub = sub
			c.close = func() { _ = sub.Close(); _ = pub.Close() }
		}
		return c, nil
	case "rocket":
		cfg, err := b.rocketConfig(a)
		if err != nil {
			return nil, err
		}
		pub, err := rocket.NewPublisher(cfg)
		if err != nil {
			return nil, fmt.Errorf("rocket %s: %w", b.namesrv, scrub(err, b.rocketSK))
		}
		c := &clients{pub: pub, close: func() { _ = pub.Close() }, addr: cfg.NameServers[0]}
		var rsub *rocket.Subscriber
		c.ensure = func(ctx context.Context, topics ...string) error {
			for _, t := range topics {
				tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				var err error
				if rsub != nil {
					// Also the group's retry topic, so a Nack comes back in a second.
					err = rsub.CreateTopic(tctx, b.rocketAddr, t, b.rocketQs)
				} else {
					err = pub.CreateTopic(tctx, b.rocketAddr, t, b.rocketQs)
				}
				cancel()
				if err != nil {
					return err
				}
			}
			return nil
		}
		if withSub {
			sub, err := rocket.NewSubscriber(cfg)
			if err != nil {
				_ = pub.Close()
				return nil, err
			}
			c.sub = sub
			rsub = sub
			c.close = func() { _ = sub.Close(); _ = pub.Close() }
		}
		return c, nil
	}
	return nil, fmt.Errorf("--broker %q: want rabbit or rocket", b.kind)
}
