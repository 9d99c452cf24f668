package broker

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Sentinel errors callers test with errors.Is.
var (
	// ErrInvalidTopic is returned for a topic outside [A-Za-z0-9_-]{1,127}.
	ErrInvalidTopic = errors.New("invalid topic")
	// ErrInvalidKey is returned for an empty, over-long or non-UTF-8 key.
	ErrInvalidKey = errors.New("invalid key")
	// ErrInvalidMessage is returned for any other field no broker can carry.
	ErrInvalidMessage = errors.New("invalid message")
	// ErrNoEnvelope means a delivery carries no delaybridge envelope at all:
	// it was published by a foreign producer.
	ErrNoEnvelope = errors.New("message has no delaybridge envelope")
	// ErrMalformedEnvelope means the envelope is present but a field of it
	// cannot be read; the *EnvelopeError wrapping it names the field.
	ErrMalformedEnvelope = errors.New("malformed delaybridge envelope")
	// ErrTooFar means a due time lies further away than the configured MaxDelay.
	ErrTooFar = errors.New("due time too far in the future")
	// ErrRejected marks a message the broker refused for good (too large,
	// delay beyond its limit); publishing it again would fail the same way.
	ErrRejected = errors.New("rejected by broker")
	// ErrHandlerFailed matches the reason a DeadLetter is given when the
	// handler's own failure sent the message to dead: it failed on its
	// last attempt, or permanently. The run that failed counts as an
	// attempt (outbox.DeadLetter adds it to the task row); other reasons
	// are about the delivery, not a handler run.
	ErrHandlerFailed = errors.New("handler failed")
	// ErrHandlerStuck means a handler kept running past its timeout and
	// grace, ignoring its context, and the runtime abandoned it.
	ErrHandlerStuck = errors.New("handler ignored its context and was abandoned")
	// ErrClosed is returned by a component used after Close.
	ErrClosed = errors.New("closed")
	// ErrWrongTopic means a delivery names another topic than the one its
	// subscription is for: a message published into the wrong queue, by
	// mistake or by someone who may write to the broker but does not own
	// the topic. The runtime refuses it and never runs a handler for it.
	ErrWrongTopic = errors.New("message is for another topic than its subscription")
	// ErrHandleAlone is a GroupHandler's result for a message it left out
	// of its group without running it: its task row was held by another
	// transaction, and waiting for that inside the group would hold up
	// every other message of it. The runtime runs such a message through
	// the Handler on its own once the group has committed; no attempt is
	// counted.
	ErrHandleAlone = errors.New("left out of its group: handle it on its own")
	// ErrUnavailable marks a handler's error that says nothing about the
	// message: what the handler runs against (its database) could not be
	// reached or could not take the work right now (outbox.Handle wraps
	// the errors of its own statements with it). The runtime gives such a
	// message back to the broker after a pause and counts no attempt, so
	// a database outage, however long, sends no task to dead.
	ErrUnavailable = errors.New("unavailable")
)

// EarlyError is returned by a handler that found its task not yet due by
// its reference clock (outbox.Handle asks the database's), however due the
// message looked by the consumer's clock: the consumer host's clock runs
// ahead, or the message lied about its due time. The runtime waits out
// Remaining, in memory or as another hop, and tries again without counting
// an attempt.
type EarlyError struct {
	// Remaining is how long until the task is due by the reference clock.
	Remaining time.Duration
}

func (e *EarlyError) Error() string {
	return fmt.Sprintf("task not due yet by the reference clock: %v to go", e.Remaining)
}

// EnvelopeError says which envelope header could not be decoded and why.
// It wraps ErrMalformedEnvelope.
type EnvelopeError struct {
	Header string
	Reason string
}

func (e *EnvelopeError) Error() string {
	return fmt.Sprintf("%v: header %s: %s", ErrMalformedEnvelope, e.Header, e.Reason)
}

// Unwrap lets errors.Is match ErrMalformedEnvelope.
func (e *EnvelopeError) Unwrap() error { return ErrMalformedEnvelope }

// PublishError reports the messages of one Publish call that the broker did
// not confirm, by their index in the call. Messages not named were confirmed.
type PublishError struct {
	Failed map[int]error
}

func (e *PublishError) Error() string {
	idx := make([]int, 0, len(e.Failed))
	for i := range e.Failed {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var b strings.Builder
	fmt.Fprintf(&b, "%d message(s) not confirmed", len(idx))
	for n, i := range idx {
		if n == 3 {
			fmt.Fprintf(&b, "; and %d more", len(idx)-3)
			break
		}
		fmt.Fprintf(&b, "; #%d: %v", i, e.Failed[i])
	}
	return b.String()
}

// Unwrap returns the failures in index order, so errors.Is and errors.As
// find a cause that any failed message had. Use PublishResults to learn
// which message failed how.
func (e *PublishError) Unwrap() []error {
	idx := make([]int, 0, len(e.Failed))
	for i := range e.Failed {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	out := make([]error, len(idx))
	for n, i := range idx {
		out[n] = e.Failed[i]
	}
	return out
}

// PublishResults spreads the error of a Publish call of n messages over the
// messages: nil for each confirmed one, its cause for each that was not. An
// error that is not a *PublishError failed every message.
func PublishResults(err error, n int) []error {
	res := make([]error, n)
	if err == nil {
		return res
	}
	var pe *PublishError
	if errors.As(err, &pe) {
		for i, e := range pe.Failed {
			if i >= 0 && i < n {
				res[i] = e
			}
		}
		return res
	}
	for i := range res {
		res[i] = err
	}
	return res
}

// permanentError marks a handler error that no retry can cure.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent wraps a handler error so the runtime sends the message to dead at
// once instead of retrying it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err was wrapped by Permanent or is a broker
// rejection.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p) || errors.Is(err, ErrRejected)
}
