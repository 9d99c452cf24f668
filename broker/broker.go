// Package broker is the contract between delaybridge and a message broker:
// an Adapter opens a Connection whose Publisher sends Messages to arrive no
// earlier than their due time, within the broker's Limits, and whose
// Subscriber hands back Deliveries to ack or nack. The rabbit and rocket
// packages implement it; brokertest checks an implementation against it.
//
// Hops, holding a message until due, retries with backoff and dead letters
// are delaybridge's, not the adapter's: an adapter only carries one hop.
package broker

import "github.com/delaybridge/delaybridge/internal/broker"

// Adapter is a broker delaybridge can use: delaybridge.Config.Broker takes
// one (rabbit.New, rocket.New).
type Adapter = broker.Adapter

// Connection is an opened adapter: its publisher, its subscriber when asked
// for, and how to close them.
type Connection = broker.Connection

// Topology names what a relay and a consumer must agree on (prefix, group,
// mode); processes that disagree refuse to start.
type Topology = broker.Topology

// Publisher sends messages, each to arrive at its DeliverAt or within one
// hop of it, and returns once the broker has confirmed them.
type Publisher = broker.Publisher

// Subscriber delivers the messages of a topic.
type Subscriber = broker.Subscriber

// Delivery is one message as a Subscriber received it, with its Acker.
type Delivery = broker.Delivery

// Acker settles a delivery: Ack removes it, Nack returns it to the broker.
type Acker = broker.Acker

// Message is one delayed task on its way through a broker.
type Message = broker.Message

// Limits describes what one broker hop can do: the longest hop, its
// precision, or the fixed delay levels.
type Limits = broker.Limits

// HopPlan is how long the broker holds a message on one publish.
type HopPlan = broker.HopPlan

// Backoff shapes the delay before each retry of a failed handler.
type Backoff = broker.Backoff

// ErrClosed is returned by a publisher or subscriber used after Close.
var ErrClosed = broker.ErrClosed

// Encode returns the envelope headers that carry m through a broker; the
// body is m.Payload. docs/envelope.md describes them.
func Encode(m *Message) map[string]string { return broker.Encode(m) }

// Decode rebuilds a Message from a broker message's headers and body. It
// never panics on any input.
func Decode(headers map[string]string, body []byte) (*Message, error) {
	return broker.Decode(headers, body)
}
