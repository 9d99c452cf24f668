package broker

import (
	"errors"
)

// Outcome is what became of a delivery the consumer runtime settled: the
// four things an operator needs told apart. A delivery handed on as
// another hop or given back to the broker (nack) is not settled yet and
// has no outcome.
type Outcome string

// Outcomes the Settled hook reports.
const (
	// OutcomeApplied: the handler ran and returned nil; the message was acked.
	OutcomeApplied Outcome = "applied"
	// OutcomeSkipped: the handler returned a Skip error (the task was
	// cancelled, already done, rescheduled ...); the message was acked
	// and nothing ran.
	OutcomeSkipped Outcome = "skipped"
	// OutcomeRetried: the handler failed and the message was published
	// again for a later attempt.
	OutcomeRetried Outcome = "retried"
	// OutcomeDead: the runtime gave up on the message and handed it to
	// the dead letter.
	OutcomeDead Outcome = "dead"
)

// ErrSkipped matches, with errors.Is, every error Skip returns.
var ErrSkipped = errors.New("message skipped")

// SkipError is a handler's word that a message needs no work: the runtime
// acks it as it acks a nil error, counts no attempt, and reports
// OutcomeSkipped with Reason instead of OutcomeApplied.
type SkipError struct {
	// Reason is a short, fixed word (a metric label): outbox uses
	// "cancelled", "done", "stale", "missing", "dead" and "snoozed".
	Reason string
}

func (e *SkipError) Error() string { return "message skipped: " + e.Reason }

// Is lets errors.Is match ErrSkipped.
func (e *SkipError) Is(target error) bool { return target == ErrSkipped }

// Skip returns the error a Handler (or a GroupHandler, per message)
// returns for a message it acks without doing anything, so hooks and
// metrics can tell it from one it applied. Keep reason to a small fixed
// set: it becomes a metric label.
func Skip(reason string) error { return &SkipError{Reason: reason} }

// skipReason returns the reason of a Skip error in err's chain.
func skipReason(err error) (string, bool) {
	var s *SkipError
	if errors.As(err, &s) {
		return s.Reason, true
	}
	return "", false
}
