package main

import (
	"context"

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/rabbit"
	"github.com/delaybridge/delaybridge/rocket"
)

// DefaultAMQPURL is the local development RabbitMQ that
// scripts/services.sh sets up. Only demo and bench fall back to it.
const DefaultAMQPURL = "amqp://delaybridge:delaybridge@127.0.0.1:5672/"

// brokerFlags are the settings that pick and configure a broker adapter:
// the library's delaybridge.Config, of which the CLI uses the broker part
// (the database settings are the root command's).
type brokerFlags struct {
	delaybridge.Config
}

// register adds every broker flag, the consumer ones included (demo,
// bench, doctor).
func (b *brokerFlags) register(fs *pflag.FlagSet) {
	b.Config = delaybridge.DefaultConfig()
	b.RegisterBrokerFlags(fs)
	b.RegisterConsumerFlags(fs)
}

// registerRelay adds the broker flags a process that only publishes
// needs (run). The consumer flags are accepted too, so a command line or
// config file shared with consumers keeps working, but they are hidden
// from --help and a command line that sets one is told run ignores it.
func (b *brokerFlags) registerRelay(fs *pflag.FlagSet) {
	b.Config = delaybridge.DefaultConfig()
	b.RegisterBrokerFlags(fs)
	consumer := pflag.NewFlagSet("consumer", pflag.ContinueOnError)
	var ignored delaybridge.Config
	ignored.RegisterConsumerFlags(consumer)
	consumer.VisitAll(func(f *pflag.Flag) {
		fs.AddFlag(f)
		_ = fs.MarkDeprecated(f.Name, "only consumers use it; this command ignores it")
	})
}

// mode names the configured delay mode for reports.
func (b *brokerFlags) mode() string { return b.Mode() }

// withLog returns the settings with a's logger.
func (b *brokerFlags) withLog(a *app) delaybridge.Config {
	c := b.Config
	c.Logger = a.log
	return c
}

func (b *brokerFlags) rabbitConfig(a *app) (rabbit.Config, error) { return b.withLog(a).RabbitConfig() }

func (b *brokerFlags) rocketConfig(a *app) (rocket.Config, error) { return b.withLog(a).RocketConfig() }

// warnings says what in the broker settings works but is weaker than it
// looks; run, demo and bench log it and doctor reports it.
func (b *brokerFlags) warnings() []string { return b.Warnings() }

// check reports bad broker flags without connecting, so a command can
// refuse them before it touches the database. It logs the warnings first.
func (b *brokerFlags) check(a *app) error {
	for _, w := range b.warnings() {
		a.log.Warn("delaybridge: " + w)
	}
	return b.withLog(a).Check()
}

// open connects the chosen adapter. withSub also builds a subscriber.
func (b *brokerFlags) open(ctx context.Context, a *app, withSub bool) (*cli.Clients, error) {
	conn, err := b.withLog(a).OpenBroker(ctx, withSub)
	if err != nil {
		return nil, err
	}
	return &cli.Clients{Pub: conn.Publisher, Sub: conn.Subscriber, Close: conn.Close, Addr: conn.Addr, Ensure: conn.CreateTopics}, nil
}
