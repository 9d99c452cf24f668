package rabbit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrConnectionLost reports a publish whose confirm never came because the
// connection or channel closed first. The message may or may not have
// reached the broker; publishing it again is safe.
var ErrConnectionLost = errors.New("rabbit: connection lost before the broker confirmed")

// ErrNacked reports a publish the broker refused with a negative confirm,
// most often because a ladder queue reached its x-max-length guard
// (x-overflow=reject-publish). It is transient: the queue drains.
var ErrNacked = errors.New("rabbit: broker nacked the publish (queue full or internal error)")

// ErrUnroutable reports a mandatory publish the broker returned because no
// queue was bound for it.
var ErrUnroutable = errors.New("rabbit: message unroutable")

// dial opens one connection named after cfg.ConnectionName and role, to
// the first node of cfg's ring that answers (see nodeRing).
func dial(ctx context.Context, cfg Config, role string) (*amqp.Connection, error) {
	return dialRecording(ctx, cfg, role, nil)
}

// dialRecording is dial that also stores the connection's socket in sock
// (when not nil), so another goroutine can close it under a connection
// stuck writing to a broker that stopped reading (Publisher.Close).
func dialRecording(ctx context.Context, cfg Config, role string, sock *atomic.Pointer[writeBehindConn]) (*amqp.Connection, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(cfg.ConnectionName + " " + role)
	ring := cfg.ring
	if ring == nil { // a Config that did not go through withDefaults
		ring = &nodeRing{urls: []string{cfg.URL}}
	}
	urls, first := ring.order()
	var errs []error
	for i, u := range urls {
		conn, err := amqp.DialConfig(u, amqp.Config{
			Heartbeat:  cfg.Heartbeat,
			Properties: props,
			Dial:       writeBehindDial(cfg.DialTimeout, sock),
			// amqp091-go writes the server name into the config it is given.
			TLSClientConfig: cfg.TLS.Clone(),
		})
		if err == nil {
			ring.reached(first, i)
			return conn, nil
		}
		if len(urls) == 1 {
			return nil, fmt.Errorf("rabbit: dial: %w", err)
		}
		errs = append(errs, fmt.Errorf("%s: %w", RedactURL(u), err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("rabbit: dial: no node answered: %w", errors.Join(errs...))
}

// writeBehindDial dials like amqp.DefaultDial and wraps the socket in a
// writeBehindConn (see wire.go), stored in sock when not nil.
func writeBehindDial(timeout time.Duration, sock *atomic.Pointer[writeBehindConn]) func(network, addr string) (net.Conn, error) {
	dial := amqp.DefaultDial(timeout)
	return func(network, addr string) (net.Conn, error) {
		c, err := dial(network, addr)
		if err != nil {
			return nil, err
		}
		w := newWriteBehindConn(c)
		if sock != nil {
			sock.Store(w)
		}
		return w, nil
	}
}

// newBackoff returns the reconnect schedule: 100ms doubling up to max,
// randomised, never giving up.
func newBackoff(max time.Duration) *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     100 * time.Millisecond,
		RandomizationFactor: 0.3,
		Multiplier:          2,
		MaxInterval:         max,
		MaxElapsedTime:      0,
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	b.Reset()
	return b
}

// closeQuietly closes conn, ignoring the error of an already dead one.
func closeQuietly(conn *amqp.Connection) {
	if conn != nil && !conn.IsClosed() {
		_ = conn.Close()
	}
}

// closeWithin closes conn, waiting at most wait for the broker's answer: a
// broker that blocks a publisher's connection (a memory or disk alarm)
// stops reading it and never answers a plain Close while the alarm lasts.
func closeWithin(conn *amqp.Connection, wait time.Duration) {
	if conn != nil && !conn.IsClosed() {
		_ = conn.CloseDeadline(time.Now().Add(wait))
	}
}
