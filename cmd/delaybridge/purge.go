package main

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/rabbit"
)

// purgeTopicQueue deletes every message waiting in topic's RabbitMQ queue,
// <prefix>.q.<topic> (docs/topology.md), and returns how many there were.
// Messages still on the ladder are not touched. The bench calls it so the
// relay starts from a broker as empty as the baseline found it: what it
// deletes is gone, never handled.
func purgeTopicQueue(ctx context.Context, cfg rabbit.Config, topic string) (int, error) {
	if err := broker.ValidateTopic(topic); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = rabbit.DefaultPrefix
	}
	conn, err := amqp.DialConfig(cfg.URL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second),
		Properties: amqp.Table{"connection_name": "delaybridge bench purge"}, TLSClientConfig: cfg.TLS.Clone()})
	if err != nil {
		return 0, fmt.Errorf("purge %s: RabbitMQ at %s: %w", topic, rabbit.RedactURL(cfg.URL), scrub(err, cfg.URL))
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", topic, err)
	}
	n, err := ch.QueuePurge(prefix+".q."+topic, false)
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", topic, err)
	}
	return n, nil
}
