package broker

import "context"

// Handler runs one due message. Returning nil acks it as applied, and an
// error from Skip acks it as skipped; an error wrapping ErrUnavailable
// gives it back to the broker after a pause, counting no attempt; any
// other error retries it later, or sends it to dead when wrapped by
// Permanent or out of attempts.
// The context is cancelled at the handler timeout and on a forced shutdown.
type Handler func(ctx context.Context, m *Message) error

// GroupHandler runs several due messages at once and reports each one's
// result: errs[i] is what the Handler would have returned for msgs[i]
// (nil acks it; an error retries it or sends it to dead, counting an
// attempt of that message alone), and ErrHandleAlone leaves msgs[i] to
// the Handler, run on its own after the group. An error of its own (err) means the
// group as a whole could not run (its transaction could not commit): each
// message then goes through the Handler one at a time. It lets a
// database-bound handler commit many tasks in one transaction
// (outbox.Group: one transaction, a savepoint per message).
type GroupHandler func(ctx context.Context, msgs []*Message) (errs []error, err error)

// RetryRecorder learns of each retry before it is published: m carries the
// new Attempt and the DeliverAt it waits for. outbox.RecordRetry keeps both
// on the task row, so the scanner neither rescues a task that is only
// waiting out its backoff nor restarts its attempt count. An error is
// logged; the retry goes ahead.
type RetryRecorder func(ctx context.Context, m *Message, cause error) error
