package main

import (
	"context"

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/driver"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/settings"
)

// DefaultAMQPURL is the local development RabbitMQ that
// scripts/services.sh sets up. Only demo and bench fall back to it.
const DefaultAMQPURL = "amqp://delaybridge:delaybridge@127.0.0.1:5672/"

// brokerFlags are the settings that pick and configure a broker adapter:
// the flat settings the library's loader reads, and the signing keys (the
// database settings are the root command's).
type brokerFlags struct {
	driver.Settings
	SigningKeys string
}

// registerShared adds the flags every process that talks to the broker
// reads, the relay included.
func (b *brokerFlags) registerShared(fs *pflag.FlagSet) {
	b.Settings = driver.Defaults()
	b.RegisterFlags(fs)
	fs.StringVar(&b.SigningKeys, "signing-keys", b.SigningKeys, "sign and check messages: id:base64secret,... (first signs)")
	settings.RegisterSecretFiles(fs)
}

// register adds every broker flag, the consumer ones included (demo,
// bench, doctor).
func (b *brokerFlags) register(fs *pflag.FlagSet) {
	b.registerShared(fs)
	b.RegisterConsumerFlags(fs)
}

// registerRelay adds the broker flags a process that only publishes
// needs (run). The consumer flags are accepted too, so a command line or
// config file shared with consumers keeps working, but they are hidden
// from --help and a command line that sets one is told run ignores it.
func (b *brokerFlags) registerRelay(fs *pflag.FlagSet) {
	b.registerShared(fs)
	consumer := pflag.NewFlagSet("consumer", pflag.ContinueOnError)
	var ignored driver.Settings
	ignored.RegisterConsumerFlags(consumer)
	consumer.VisitAll(func(f *pflag.Flag) {
		fs.AddFlag(f)
		_ = fs.MarkDeprecated(f.Name, "only consumers use it; this command ignores it")
	})
}

// mode names the configured delay mode for reports.
func (b *brokerFlags) mode() string { return b.Mode() }

// config returns the library's Config for these settings, with a's
// logger: the adapter --broker names, and the signing keys.
func (b *brokerFlags) config(a *app) (delaybridge.Config, error) {
	ad, err := b.Adapter(a.log)
	if err != nil {
		return delaybridge.Config{}, err
	}
	return delaybridge.Config{Broker: ad, SigningKeys: b.SigningKeys, Logger: a.log}, nil
}

func (b *brokerFlags) rabbitConfig(a *app) (rabbit.Config, error) {
	return adapterConfig[rabbit.Config](b, a, "rabbit")
}

func (b *brokerFlags) rocketConfig(a *app) (rocket.Config, error) {
	return adapterConfig[rocket.Config](b, a, "rocket")
}

// adapterConfig is the configuration of the adapter name from b's
// settings, whatever --broker says, with a's logger.
func adapterConfig[T any](b *brokerFlags, a *app, name string) (T, error) {
	s := b.Settings
	s.Broker = name
	return driver.ConfigOf[T](&s, a.log)
}

// warnings says what in the broker settings works but is weaker than it
// looks; run, demo and bench log it and doctor reports it.
func (b *brokerFlags) warnings() []string { return b.Warnings() }

// check reports bad broker flags without connecting, so a command can
// refuse them before it touches the database. It logs the warnings first.
func (b *brokerFlags) check(a *app) error {
	for _, w := range b.warnings() {
		a.log.Warn("delaybridge: " + w)
	}
	cfg, err := b.config(a)
	if err != nil {
		return err
	}
	return cfg.Check()
}

// topology is the broker topology these flags configure, as the presence
// table records it.
func (b *brokerFlags) topology(a *app) (broker.Topology, error) {
	ad, err := b.Adapter(a.log)
	if err != nil {
		return broker.Topology{}, err
	}
	return ad.Topology()
}

// open connects the chosen adapter, signed when --signing-keys is set.
// withSub also builds a subscriber.
func (b *brokerFlags) open(ctx context.Context, a *app, withSub bool) (*cli.Clients, error) {
	ad, err := b.Adapter(a.log)
	if err != nil {
		return nil, err
	}
	conn, err := driver.Open(ctx, ad, b.SigningKeys, a.log, withSub)
	if err != nil {
		return nil, err
	}
	return &cli.Clients{Pub: conn.Publisher, Sub: conn.Subscriber, Close: conn.Close, Addr: conn.Addr, Ensure: conn.CreateTopics}, nil
}
