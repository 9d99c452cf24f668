package rabbit

import (
	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/rabbit"
)

// Config configures the RabbitMQ adapter. Zero fields take their defaults;
// each field says its default, and docs/flags.md explains the flag that
// sets it.
type Config = rabbit.Config

// Mode is how messages are delayed: the ladder of quorum queues or the
// delayed-message exchange.
type Mode = rabbit.Mode

// The delay modes.
const (
	ModeLadder          = rabbit.ModeLadder
	ModeDelayedExchange = rabbit.ModeDelayedExchange
)

// DeadLettering is the ladder's dead-letter strategy: AtLeastOnce on
// RabbitMQ 3.12.5 and later clusters, AtMostOnce before.
type DeadLettering = rabbit.DeadLettering

// The dead-letter strategies.
const (
	AtLeastOnce = rabbit.AtLeastOnce
	AtMostOnce  = rabbit.AtMostOnce
)

// ErrPluginMissing is the error of connecting in ModeDelayedExchange to a
// broker without the delayed-message plugin.
var ErrPluginMissing = rabbit.ErrPluginMissing

// New returns the RabbitMQ adapter for delaybridge.Config.Broker. It does not
// connect; the client connects when it starts.
func New(cfg Config) broker.Adapter { return rabbit.New(cfg) }
