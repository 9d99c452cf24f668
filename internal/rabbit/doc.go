// Package rabbit is the RabbitMQ adapter's implementation. Users import the
// public package github.com/delaybridge/delaybridge/rabbit, whose
// documentation explains the modes, the envelope and the connections.
package rabbit
