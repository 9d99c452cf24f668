package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// settle acts on a handler's result for j: ack, wait (not due by the
// handler's reference clock), dead or retry.
func (c *Consumer) settle(j job, err error, lateness time.Duration) {
	m := j.d.Message
	var early *EarlyError
	switch {
	case err == nil:
		endSpan(m, string(OutcomeApplied), "", nil)
		c.ack(j)
		if c.cfg.Hooks.Handled != nil {
			c.cfg.Hooks.Handled(j.topic, max(lateness, 0))
		}
		c.settled(j.topic, OutcomeApplied, "")
	case errors.Is(err, ErrSkipped):
		// Nothing to do, and nothing that a retry would change: ack, even
		// on a forced shutdown.
		reason, _ := skipReason(err)
		endSpan(m, string(OutcomeSkipped), reason, err)
		c.ack(j)
		c.settled(j.topic, OutcomeSkipped, reason)
	case c.hardCtx.Err() != nil:
		// Forced shutdown interrupted the handler: give the message back.
		endSpan(m, "released", "shutdown", err)
		c.nack(j)
	case errors.Is(err, ErrUnavailable) && !IsPermanent(err):
		// The handler's database, not the message, failed: give it back
		// after a pause, counting no attempt. A retry would spend one of
		// its attempts on every pass, and an outage longer than the
		// backoff would send every task due in it to dead.
		c.log.Warn("delaybridge: the handler's database is unavailable; giving the message back", "topic", j.topic, "key", m.Key, "err", err)
		endSpan(m, "released", "unavailable", err)
		c.pauseThenNack(j)
	case errors.As(err, &early):
		// Due by this host's clock, not by the handler's reference clock:
		// wait out the difference, counting no attempt.
		c.log.Info("delaybridge: task not due yet by the reference clock; waiting (is this host's clock ahead?)",
			"topic", m.Topic, "key", m.Key, "remaining", early.Remaining)
		if early.Remaining <= 0 {
			early.Remaining = time.Millisecond
		}
		endSpan(m, "waiting", "early", err)
		now := c.cfg.Now()
		m.DeliverAt = MillisUTC(now.Add(early.Remaining + time.Millisecond))
		c.wait(j, m, now, m.DeliverAt.Sub(now))
	case IsPermanent(err):
		endSpan(m, string(OutcomeDead), "permanent", err)
		c.dead(j, &handlerFailed{fmt.Errorf("permanent failure on attempt %d: %w", m.Attempt+1, err)})
	case m.Attempt+1 >= c.cfg.policy(j.topic).MaxAttempts:
		endSpan(m, string(OutcomeDead), "attempts", err)
		c.dead(j, &handlerFailed{fmt.Errorf("failed %d attempts, last: %w", m.Attempt+1, err)})
	default:
		endSpan(m, string(OutcomeRetried), "", err)
		c.retry(j, err)
	}
}

// wait settles a message that is not due yet: another hop when the broker
// can carry it closer to due and the remainder exceeds the hold window,
// otherwise held in memory until due. A hop must make progress: when the
// planner offers no delay (the remainder is shorter than the smallest delay
// level), publishing again would come straight back, so the message is held
// however long the remainder is.
func (c *Consumer) wait(j job, m *Message, now time.Time, remaining time.Duration) {
	if remaining > c.cfg.HoldWindow && c.pub.Limits().Plan(now, m.DeliverAt).Delay > 0 {
		c.hop(j, m)
		return
	}
	if !c.hold(j, remaining) {
		c.nack(j)
	}
}

// hop publishes an early message (m, the delivery's message or a copy with
// a corrected due time) again towards its due time and acks the original
// once the broker confirmed the new one.
func (c *Consumer) hop(j job, m *Message) {
	m = m.Clone()
	m.Hop++
	if err := c.publish(m); err != nil {
		if IsPermanent(err) {
			c.dead(j, fmt.Errorf("the broker refused the next hop: %w", err))
			return
		}
		c.log.Warn("delaybridge: re-publishing an early message failed; giving it back", "topic", m.Topic, "key", m.Key, "err", err)
		c.pauseThenNack(j)
		return
	}
	c.ack(j)
	if c.cfg.Hooks.Hopped != nil {
		c.cfg.Hooks.Hopped(j.topic, m.Hop)
	}
}

// retry publishes a failed message again for its next attempt.
func (c *Consumer) retry(j job, cause error) {
	m := j.d.Message.Clone()
	m.Attempt++
	m.Hop = 0
	m.Rerun = false
	m.DeliverAt = MillisUTC(c.cfg.Now().Add(c.backoff(j.topic, m.Attempt)))
	c.log.Info("delaybridge: handler failed; retrying later", "topic", m.Topic, "key", m.Key, "attempt", m.Attempt, "at", m.DeliverAt, "err", cause)
	if c.cfg.OnRetry != nil {
		ctx, cancel := context.WithTimeout(c.hardCtx, 10*time.Second)
		if err := c.cfg.OnRetry(ctx, m.Clone(), cause); err != nil {
			c.log.Warn("delaybridge: recording a retry failed; retrying anyway", "topic", m.Topic, "key", m.Key, "err", err)
		}
		cancel()
	}
	if err := c.publish(m); err != nil {
		if IsPermanent(err) {
			c.dead(j, fmt.Errorf("the broker refused the retry after %v: %w", cause, err))
			return
		}
		c.log.Warn("delaybridge: publishing a retry failed; giving it back", "topic", m.Topic, "key", m.Key, "err", err)
		c.pauseThenNack(j)
		return
	}
	c.ack(j)
	if c.cfg.Hooks.Retried != nil {
		c.cfg.Hooks.Retried(j.topic, m.Attempt)
	}
	c.settled(j.topic, OutcomeRetried, "")
}

// settled reports a delivery's outcome to the Settled hook.
func (c *Consumer) settled(topic string, o Outcome, reason string) {
	if c.cfg.Hooks.Settled != nil {
		c.cfg.Hooks.Settled(topic, o, reason)
	}
}

func (c *Consumer) publish(m *Message) error {
	ctx, cancel := context.WithTimeout(c.hardCtx, 30*time.Second)
	defer cancel()
	return c.pub.Publish(ctx, m)
}

// backoff returns the randomised delay before retry number attempt
// (1-based) of a message of topic.
func (c *Consumer) backoff(topic string, attempt int) time.Duration {
	p := c.cfg.policy(topic).Backoff
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.Initial,
		RandomizationFactor: p.Jitter,
		Multiplier:          p.Multiplier,
		MaxInterval:         p.Max,
		Clock:               backoff.SystemClock,
	}
	b.Reset()
	d := b.NextBackOff()
	for i := 1; i < attempt; i++ {
		d = b.NextBackOff()
	}
	return d
}

func (c *Consumer) dead(j job, reason error) {
	ctx, cancel := context.WithTimeout(c.hardCtx, 30*time.Second)
	defer cancel()
	topic := j.topic
	if err := c.cfg.DeadLetter.Dead(ctx, j.d, reason); err != nil {
		c.log.Error("delaybridge: dead letter failed; giving the message back", "topic", topic, "reason", reason, "err", err)
		c.pauseThenNack(j)
		return
	}
	c.log.Warn("delaybridge: message sent to dead", "topic", topic, "reason", reason)
	c.ack(j)
	if c.cfg.Hooks.Dead != nil {
		c.cfg.Hooks.Dead(topic, reason)
	}
	c.settled(topic, OutcomeDead, "")
}

func (c *Consumer) ack(j job) {
	defer c.release(j)
	if err := j.d.Acker.Ack(); errors.Is(err, ErrClosed) {
		// Close ended the subscription while this message was handled,
		// and it gave the delivery back: the broker redelivers it and
		// Handle finds the task done. Part of every shutdown under load,
		// not a fault.
		c.log.Info("delaybridge: handled as the subscription ended; the broker will redeliver it, and the done task makes that a no-op", "topic", j.topic)
	} else if err != nil {
		// The broker will redeliver; Handle makes the second run a no-op.
		c.log.Warn("delaybridge: ack failed; the broker will redeliver", "topic", j.topic, "err", err)
	}
}

func (c *Consumer) nack(j job) {
	defer c.release(j)
	if err := j.d.Acker.Nack(); errors.Is(err, ErrClosed) {
		// The subscription already gave it back when it ended.
		c.log.Debug("delaybridge: delivery already given back", "topic", j.topic)
	} else if err != nil {
		c.log.Warn("delaybridge: nack failed; the broker redelivers after the connection closes", "topic", j.topic, "err", err)
	}
}

func (c *Consumer) pauseThenNack(j job) {
	c.pause()
	c.nack(j)
}

// pause waits pauseBeforeNack, or less if the consumer is stopping.
func (c *Consumer) pause() {
	t := time.NewTimer(pauseBeforeNack)
	select {
	case <-t.C:
	case <-c.stopping:
		t.Stop()
	}
}

// handlerFailed is the dead-letter reason when the handler's own failure
// sent a message to dead: out of attempts, or a permanent error. It
// matches ErrHandlerFailed and reads as the reason it wraps.
type handlerFailed struct{ err error }

func (e *handlerFailed) Error() string        { return e.err.Error() }
func (e *handlerFailed) Unwrap() error        { return e.err }
func (e *handlerFailed) Is(target error) bool { return target == ErrHandlerFailed }
