// Package rabbit is the RabbitMQ adapter: a Publisher with pipelined
// confirms and a Subscriber with manual acks and reconnect, delaying messages
// either through a plugin-free ladder of quorum queues (the default) or the
// x-delayed-message exchange when that plugin is installed and chosen.
package rabbit
