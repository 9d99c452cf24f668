package broker

import "context"

// Publisher sends messages to a broker, each to be delivered at its next hop
// as Limits().Plan plans it from the time of the call to Message.DeliverAt.
//
// Publish returns only after the broker confirmed every message it reports as
// sent. It returns nil when all were confirmed, a *PublishError naming the
// ones that were not, or another error when none was; PublishResults spreads
// any of these over the messages. A message the broker refused for good
// carries an error matching ErrRejected. Implementations are safe for
// concurrent use.
type Publisher interface {
	Publish(ctx context.Context, msgs ...*Message) error
	Limits() Limits
}

// Subscriber delivers the messages of a topic as they come due at the
// broker. The channel closes when ctx is done or the subscriber is closed;
// every delivery not acked by then goes back to the broker for another
// consumer. Implementations are safe for concurrent use.
type Subscriber interface {
	Subscribe(ctx context.Context, topic string) (<-chan *Delivery, error)
}

// Delivery is one message as a Subscriber received it.
type Delivery struct {
	// Message is the decoded message, nil when Err is set.
	Message *Message
	// Err says why the envelope could not be decoded (ErrNoEnvelope or an
	// *EnvelopeError). The runtime sends such a delivery to dead.
	Err error
	// Headers and Body are the broker message as received, kept for
	// dead-lettering what could not be decoded.
	Headers map[string]string
	Body    []byte
	// Acker settles the delivery with the broker.
	Acker Acker
}

// Acker settles one delivery. Exactly one of its methods is called, once.
type Acker interface {
	// Ack tells the broker the message is finished with.
	Ack() error
	// Nack gives the message back to the broker for redelivery.
	Nack() error
}

// DeadLetter takes a delivery the runtime gave up on: its handler kept
// failing, it failed permanently, or it could not be decoded. The runtime
// acks the delivery only after Dead returned nil.
type DeadLetter interface {
	Dead(ctx context.Context, d *Delivery, reason error) error
}

// DeadLetterFunc adapts a function to DeadLetter.
type DeadLetterFunc func(ctx context.Context, d *Delivery, reason error) error

// Dead calls f.
func (f DeadLetterFunc) Dead(ctx context.Context, d *Delivery, reason error) error {
	return f(ctx, d, reason)
}
