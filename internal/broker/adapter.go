package broker

import (
	"context"
	"log/slog"
)

// Adapter is a broker adapter as a delaybridge.Config takes it: rabbit.New
// and rocket.New build one from their Config.
type Adapter interface {
	// Name is the adapter as --broker names it: "rabbit" or "rocket".
	Name() string
	// Mode is its delay mechanism: ladder, delayed-exchange, timer or
	// levels.
	Mode() string
	// Topology checks the settings without connecting and returns what
	// every relay and consumer of one outbox must share.
	Topology() (Topology, error)
	// Open connects. withSubscriber also builds a subscriber. logger
	// receives the adapter's logs unless its Config names one.
	Open(ctx context.Context, logger *slog.Logger, withSubscriber bool) (*Connection, error)
}

// Connection is an opened Adapter.
type Connection struct {
	// Publisher publishes tasks, hops, retries and dead letters.
	Publisher Publisher
	// Subscriber is nil unless the connection was opened for a consumer.
	Subscriber Subscriber
	// Addr is the broker address a readiness check dials.
	Addr string
	// CreateTopics creates topics that must exist before a consumer
	// starts (RocketMQ; with a subscriber also each group's retry topic).
	// It does nothing on RabbitMQ, whose adapter declares its queues.
	CreateTopics func(ctx context.Context, topics ...string) error
	// AutoCreate asks a Client to create its handlers' topics when it
	// starts (rocket.Config.CreateTopics).
	AutoCreate bool
	// Close closes the subscriber, then the publisher, logging a failure.
	Close func()
}
