package broker

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// run calls the handler for m under guard.
func (c *Consumer) run(m *Message) error {
	mc := m.Clone()
	if m.Rerun && c.cfg.Hooks.Rerun != nil {
		c.cfg.Hooks.Rerun(m.Topic)
	}
	err := c.guard(m.Topic, c.cfg.policy(m.Topic).HandlerTimeout, "key "+m.Key, func(ctx context.Context) error { return c.h(SpanContext(ctx, mc), mc) })
	// The attempt the handler's store counts decides retry or dead (see
	// Message.Attempt); an abandoned handler may still be writing mc.
	if !errors.Is(err, ErrHandlerStuck) && mc.Attempt >= 0 {
		m.Attempt = mc.Attempt
	}
	return err
}

// guard runs f on a goroutine of its own with the handler timeout, turning
// a panic into an error. When f outlives its timeout by HandlerGrace, guard
// abandons it and returns ErrHandlerStuck; f's goroutine stays counted in
// wg and Stuck until it returns.
func (c *Consumer) guard(topic string, timeout time.Duration, what string, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(c.hardCtx, timeout)
	done := make(chan error, 1)
	var abandoned atomic.Bool
	start := time.Now()
	c.wg.Add(1)
	c.running.Add(1)
	go func() {
		defer c.wg.Done()
		defer c.running.Add(-1)
		defer cancel()
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					c.log.Error("delaybridge: handler panicked", "topic", topic, "handling", what, "panic", r, "stack", string(debug.Stack()))
					err = fmt.Errorf("handler panicked: %v", r)
				}
			}()
			return f(ctx)
		}()
		done <- err
		// Whichever side clears the flag uncounts the abandonment, once.
		if abandoned.CompareAndSwap(true, false) {
			c.stuck.Add(-1)
			c.log.Warn("delaybridge: an abandoned handler returned at last", "topic", topic, "handling", what, "ran", time.Since(start).Round(time.Millisecond), "err", err)
		}
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	grace := time.NewTimer(c.cfg.HandlerGrace)
	defer grace.Stop()
	select {
	case err := <-done:
		return err
	case <-grace.C:
	}
	// Count it before the goroutine can see the flag, so the count never
	// goes below zero.
	c.stuck.Add(1)
	abandoned.Store(true)
	select {
	case err := <-done:
		// It returned while being abandoned: nothing is stuck after all.
		if abandoned.CompareAndSwap(true, false) {
			c.stuck.Add(-1)
		}
		return err
	default:
	}
	c.log.Error("delaybridge: handler ignored its context; abandoning it and freeing its worker",
		"topic", topic, "handling", what, "timeout", timeout, "grace", c.cfg.HandlerGrace, "stuck", c.stuck.Load())
	if c.cfg.Hooks.Stuck != nil {
		c.cfg.Hooks.Stuck(topic)
	}
	return fmt.Errorf("%w: still running %v after its %v timeout", ErrHandlerStuck, c.cfg.HandlerGrace, timeout)
}

// Stuck returns how many abandoned handlers are still running: each ran
// past HandlerTimeout plus HandlerGrace ignoring its context. A number that
// keeps growing means a handler that never returns and leaks a goroutine
// per attempt.
func (c *Consumer) Stuck() int { return int(c.stuck.Load()) }
