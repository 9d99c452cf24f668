package rabbit

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/driver"
	"github.com/delaybridge/delaybridge/internal/redact"
	"github.com/delaybridge/delaybridge/internal/settings"
)

func init() {
	driver.Register("rabbit", driver.Entry{
		Defaults: func(s *driver.Settings) {
			s.RabbitMode = "ladder"
			s.RabbitPrefix = DefaultPrefix
			s.RabbitUnit = DefaultUnit
			s.RabbitDepth = DefaultDepth
			s.RabbitPrefetch = DefaultPrefetch
			s.RabbitMaxLength = DefaultMaxLength
			s.RabbitDeadLettering = AtLeastOnce.String()
		},
		Config:  func(s *driver.Settings, logger *slog.Logger) (any, error) { return fromSettings(s, logger) },
		Adapter: func(cfg any) broker.Adapter { return New(cfg.(Config)) },
	})
}

// New returns the RabbitMQ adapter a delaybridge.Config takes as its
// Broker. The relay and every consumer must agree on cfg's Prefix, Mode,
// Unit and Depth.
func New(cfg Config) broker.Adapter { return adapter{cfg} }

type adapter struct{ cfg Config }

func (a adapter) Name() string { return "rabbit" }

func (a adapter) Mode() string {
	if a.cfg.Mode == ModeDelayedExchange {
		return "delayed-exchange"
	}
	return "ladder"
}

func (a adapter) Topology() (broker.Topology, error) {
	if a.cfg.URL == "" {
		return broker.Topology{}, &settings.NotConfiguredError{Setting: "amqp-url", What: "no RabbitMQ configured"}
	}
	return a.cfg.Topology()
}

func (a adapter) Open(ctx context.Context, logger *slog.Logger, withSub bool) (*broker.Connection, error) {
	cfg := a.cfg
	if cfg.Logger == nil {
		cfg.Logger = logger
	}
	pub, err := NewPublisher(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("rabbit %s: %w", RedactURL(cfg.URL), redact.Scrub(err, cfg.URL))
	}
	if cfg.Mode == ModeDelayedExchange {
		// Once per process: run and a Client open their adapter once.
		cmp.Or(cfg.Logger, slog.Default()).Warn(pluginRetired)
	}
	conn := &broker.Connection{Publisher: pub, Close: func() { driver.CloseLogged(cfg.Logger, "rabbit", "publisher", pub) },
		CreateTopics: func(context.Context, ...string) error { return nil }}
	if u, err := url.Parse(cfg.URL); err == nil {
		port := u.Port()
		if port == "" {
			port = map[bool]string{true: "5671", false: "5672"}[u.Scheme == "amqps"]
		}
		conn.Addr = net.JoinHostPort(u.Hostname(), port)
	}
	if withSub {
		sub, err := NewSubscriber(cfg)
		if err != nil {
			_ = pub.Close()
			return nil, err
		}
		conn.Subscriber = sub
		conn.Close = func() {
			driver.CloseLogged(cfg.Logger, "rabbit", "subscriber", sub)
			driver.CloseLogged(cfg.Logger, "rabbit", "publisher", pub)
		}
	}
	return conn, nil
}

// fromSettings checks the flat settings and builds the Config they name.
func fromSettings(c *driver.Settings, logger *slog.Logger) (Config, error) {
	cfg := Config{URL: c.AMQPURL, Nodes: c.AMQPNodes, Prefix: c.RabbitPrefix, Unit: c.RabbitUnit, Lead: c.RabbitLead, Depth: c.RabbitDepth, Prefetch: c.RabbitPrefetch, MaxLength: c.RabbitMaxLength, Logger: logger}
	if c.AMQPURL == "" {
		return cfg, &settings.NotConfiguredError{Setting: "amqp-url", What: "no RabbitMQ configured"}
	}
	if c.RabbitPrefetch <= 0 || c.RabbitPrefetch > MaxPrefetch {
		return cfg, fmt.Errorf("--rabbit-prefetch must be 1 to %d (AMQP's prefetch count is 16 bits), not %d", MaxPrefetch, c.RabbitPrefetch)
	}
	if c.RabbitDeadLettering != "" {
		d, err := ParseDeadLettering(c.RabbitDeadLettering)
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
		return cfg, fmt.Errorf("--amqp-tls-* flags need an amqps:// --amqp-url, not %s", RedactURL(c.AMQPURL))
	}
	cfg.TLS = tc
	switch c.RabbitMode {
	case "ladder":
		cfg.Mode = ModeLadder
		if c.RabbitDepth != 0 && (c.RabbitDepth < 1 || c.RabbitDepth > 62) {
			return cfg, fmt.Errorf("--rabbit-depth %d: want 1 to 62 (0 for the default, %d)", c.RabbitDepth, DefaultDepth)
		}
		if c.RabbitUnit < 0 || c.RabbitUnit%time.Millisecond != 0 {
			return cfg, fmt.Errorf("--rabbit-unit %v: want a whole number of milliseconds (0 for the default, %v)", c.RabbitUnit, DefaultUnit)
		}
	case "delayed-exchange":
		cfg.Mode = ModeDelayedExchange
	default:
		return cfg, fmt.Errorf("--rabbit-mode %q: want ladder or delayed-exchange", c.RabbitMode)
	}
	if _, err := cfg.Topology(); err != nil {
		return cfg, fmt.Errorf("RabbitMQ settings (--amqp-url, --amqp-nodes, --rabbit-*): %w", err)
	}
	return cfg, nil
}
