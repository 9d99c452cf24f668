package rocket

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/driver"
	"github.com/delaybridge/delaybridge/internal/redact"
	"github.com/delaybridge/delaybridge/internal/settings"
)

func init() {
	driver.Register("rocket", driver.Entry{
		Defaults: func(s *driver.Settings) {
			s.RocketNameServers = "127.0.0.1:9876"
			s.RocketMode = "timer"
			s.RocketLevels = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
			s.RocketGroupPrefix = DefaultGroupPrefix
			s.RocketBrokerAddr = "127.0.0.1:10911"
			s.RocketQueues = defaultQueues
			s.RocketConsumeGoroutines = DefaultConsumeGoroutines
		},
		Config:  func(s *driver.Settings, logger *slog.Logger) (any, error) { return fromSettings(s, logger) },
		Adapter: func(cfg any) broker.Adapter { return New(cfg.(Config)) },
	})
}

// defaultQueues is Config.Queues' default.
const defaultQueues = 8

// New returns the RocketMQ adapter a delaybridge.Config takes as its
// Broker. The relay and every consumer must agree on cfg's Limits.
func New(cfg Config) broker.Adapter { return adapter{cfg} }

type adapter struct{ cfg Config }

func (a adapter) Name() string { return "rocket" }

func (a adapter) Mode() string {
	if len(a.cfg.Limits.Levels) > 0 {
		return "levels"
	}
	return "timer"
}

func (a adapter) Topology() (broker.Topology, error) {
	if a.cfg.CreateTopics && a.cfg.BrokerAddr == "" {
		return broker.Topology{}, errors.New("rocket: Config.CreateTopics needs a BrokerAddr")
	}
	return a.cfg.Topology()
}

func (a adapter) Open(ctx context.Context, logger *slog.Logger, withSub bool) (*broker.Connection, error) {
	cfg := a.cfg
	if cfg.Logger == nil {
		cfg.Logger = logger
	}
	if cfg.Queues == 0 {
		cfg.Queues = defaultQueues
	}
	pub, err := NewPublisher(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("rocket %s: %w", strings.Join(cfg.NameServers, ","), redact.Scrub(err, cfg.SecretKey))
	}
	conn := &broker.Connection{Publisher: pub, AutoCreate: cfg.CreateTopics,
		Close: func() { driver.CloseLogged(cfg.Logger, "rocket", "publisher", pub) }}
	if len(cfg.NameServers) > 0 {
		conn.Addr = cfg.NameServers[0]
	}
	var sub *Subscriber
	conn.CreateTopics = func(ctx context.Context, topics ...string) error {
		for _, t := range topics {
			tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			var err error
			if sub != nil {
				err = sub.CreateTopic(tctx, cfg.BrokerAddr, t, cfg.Queues)
			} else {
				err = pub.CreateTopic(tctx, cfg.BrokerAddr, t, cfg.Queues)
			}
			cancel()
			if err != nil {
				return err
			}
		}
		return nil
	}
	if withSub {
		s, err := NewSubscriber(cfg)
		if err != nil {
			_ = pub.Close()
			return nil, err
		}
		sub = s
		conn.Subscriber = s
		conn.Close = func() {
			driver.CloseLogged(cfg.Logger, "rocket", "subscriber", s)
			driver.CloseLogged(cfg.Logger, "rocket", "publisher", pub)
		}
	}
	return conn, nil
}

// fromSettings checks the flat settings and builds the Config they name.
func fromSettings(c *driver.Settings, logger *slog.Logger) (Config, error) {
	cfg := Config{GroupPrefix: c.RocketGroupPrefix, Logger: logger, AccessKey: c.RocketAccessKey, SecretKey: c.RocketSecretKey, TLS: c.RocketTLS,
		ConsumeGoroutines: c.RocketConsumeGoroutines, Lead: c.RocketLead, CreateTopics: c.RocketCreateTopics, BrokerAddr: c.RocketBrokerAddr, Queues: c.RocketQueues}
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
		cfg.Limits = TimerLimits(c.RocketMaxDelay, c.RocketPrecision)
	case "levels":
		lv, err := parseLevelsSetting(c.RocketLevels)
		if err != nil {
			return cfg, err
		}
		cfg.Limits = LevelLimits(lv, c.RocketMaxDelay)
	default:
		return cfg, fmt.Errorf("--rocketmq-mode %q: want timer or levels", c.RocketMode)
	}
	if err := cfg.Limits.Validate(); err != nil {
		return cfg, err
	}
	if len(cfg.NameServers) == 0 {
		return cfg, &settings.NotConfiguredError{Setting: "rocketmq-namesrv", What: "no RocketMQ name server configured"}
	}
	if c.RocketConsumeGoroutines < 0 || c.RocketConsumeGoroutines > MaxConsumeGoroutines {
		return cfg, fmt.Errorf("--rocketmq-consume-goroutines %d: want 1 to %d (0 for the default, %d)", c.RocketConsumeGoroutines, MaxConsumeGoroutines, DefaultConsumeGoroutines)
	}
	if c.RocketQueues < 0 {
		return cfg, fmt.Errorf("--rocketmq-queues %d: want 1 or more (0 for the default, %d)", c.RocketQueues, defaultQueues)
	}
	if _, err := cfg.Topology(); err != nil {
		return cfg, fmt.Errorf("RocketMQ settings (--rocketmq-*): %w", err)
	}
	return cfg, nil
}
