package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/store"
)

// State is where a task is in its life: pending → published → done, or
// cancelled, or dead.
type State string

// Task states as stored in delay_task.state.
const (
	// StatePending: written, not yet confirmed by a broker.
	StatePending State = "pending"
	// StatePublished: a broker confirmed a message for the current generation.
	StatePublished State = "published"
	// StateDone: the handler ran and committed through Handle.
	StateDone State = "done"
	// StateCancelled: Cancel was called before it was done.
	StateCancelled State = "cancelled"
	// StateDead: the broker rejected it for good, or the handler gave up.
	StateDead State = "dead"
)

// Sentinel errors callers test with errors.Is.
var (
	// ErrDuplicate: a task with this (topic, key) already exists.
	ErrDuplicate = errors.New("outbox: task already scheduled for this topic and key")
	// ErrNotFound: no task with this (topic, key).
	ErrNotFound = errors.New("outbox: no such task")
	// ErrFinished: the task is done or cancelled and cannot change.
	ErrFinished = errors.New("outbox: task already finished")
	// ErrNotDead: Replay found the task in a state other than dead.
	ErrNotDead = errors.New("outbox: task is not dead")
	// ErrPayloadTooLarge: the payload exceeds DefaultMaxPayload.
	ErrPayloadTooLarge = errors.New("outbox: payload too large")
	// ErrInvalidDue: the due time is zero.
	ErrInvalidDue = errors.New("outbox: invalid due time")
)

// Task is what a producer schedules.
type Task struct {
	// Topic is the destination, [A-Za-z0-9_-]{1,127}.
	Topic string
	// Key is the business key, unique within the topic, 1 to 255 bytes.
	Key string
	// DueAt is when the handler may run. It is stored in UTC, rounded up
	// to the millisecond, so the handler never runs before it.
	DueAt time.Time
	// Payload travels to the handler untouched.
	Payload []byte
	// Headers are free string headers carried with the message.
	Headers map[string]string
	// Trace is the trace context the handler's span links to: a W3C
	// traceparent, optionally followed by one space and the tracestate.
	// Left empty, Schedule fills it from the span in its context, if any.
	Trace string
}

// TaskInfo is a task row as Get returns it.
type TaskInfo struct {
	ID         int64
	Task       Task
	State      State
	Generation int64
	// PublishAttempts counts the relay's publishes of this generation
	// (failed ones included); Attempts is the handler attempt the
	// consumer last recorded (0 until a handler failed once).
	PublishAttempts int
	Attempts        int
	Rescues         int
	// Snoozes counts the handler's snoozes (Snooze) since the task was
	// scheduled, rescheduled or replayed; LastError then holds the last
	// one's reason.
	Snoozes   int
	LastError string
	CreatedAt time.Time
	UpdatedAt time.Time
	// PublishedAt is when the task was last handed to the broker: the
	// relay's claim, or the scanner's rescue. Zero until then, and again
	// once a publish failed.
	PublishedAt time.Time
	DoneAt      time.Time // zero until done
}

// config bounds what Schedule accepts. Its zero value means the defaults;
// only tests set others.
type config struct {
	// MaxPayload is the largest payload in bytes. Default 256 KiB, well
	// under RocketMQ's 4 MiB message limit and MEDIUMBLOB's 16 MiB. A value
	// above maxPayloadCeiling means maxPayloadCeiling.
	MaxPayload int
	// MaxDelay is the furthest due time accepted, from now. Default
	// DefaultMaxDelay, 10 years (a consumer accepts a day more, for clock
	// skew: broker.DefaultMaxDelay).
	MaxDelay time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// The limits Schedule applies: the largest payload in bytes (well under
// RocketMQ's 4 MiB message limit and MEDIUMBLOB's 16 MiB), and the furthest
// due time from now (a consumer accepts a day more, for clock skew:
// broker.DefaultMaxDelay).
const (
	DefaultMaxPayload = 256 << 10
	DefaultMaxDelay   = 10 * 365 * 24 * time.Hour
)

// maxPayloadCeiling is the largest MaxPayload takes effect: RocketMQ's
// default body limit of 4 MiB less 64 KiB, room for the client's
// compression of an incompressible body to grow it a little. RabbitMQ and
// the payload column (MEDIUMBLOB, 16 MiB) take more; a task must be able to
// travel through either broker.
const maxPayloadCeiling = 4<<20 - 64<<10

func (c config) withDefaults() config {
	if c.MaxPayload <= 0 {
		c.MaxPayload = DefaultMaxPayload
	}
	c.MaxPayload = min(c.MaxPayload, maxPayloadCeiling)
	if c.MaxDelay <= 0 {
		c.MaxDelay = DefaultMaxDelay
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Querier is what the task functions need: a *sql.Tx (the usual case, so
// the task commits or rolls back with the caller's own writes), a *sql.DB or
// a *sql.Conn.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// validate checks t against the config before anything is written.
func (c config) validate(t *Task) error {
	if err := broker.ValidateTopic(t.Topic); err != nil {
		return err
	}
	if err := broker.ValidateKey(t.Key); err != nil {
		return err
	}
	if err := c.validateDue(t.DueAt); err != nil {
		return err
	}
	if len(t.Payload) > c.MaxPayload {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrPayloadTooLarge, len(t.Payload), c.MaxPayload)
	}
	m := broker.Message{Topic: t.Topic, Key: t.Key, DeliverAt: t.DueAt, Trace: t.Trace, Headers: t.Headers}
	return m.Validate()
}

func (c config) validateDue(due time.Time) error {
	if due.IsZero() {
		return fmt.Errorf("%w: zero", ErrInvalidDue)
	}
	if lim := c.Now().Add(c.MaxDelay); due.After(lim) {
		return fmt.Errorf("%w: %s is more than %v away", broker.ErrTooFar, due.UTC().Format(time.RFC3339), c.MaxDelay)
	}
	// The bound is an instant (2000-01-01 UTC), the one the envelope
	// enforces, never a calendar year in the caller's time zone: a due time
	// Schedule accepts must be one every consumer can decode.
	if err := broker.CheckDeliverAt(due); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidDue, err)
	}
	return nil
}

// ErrNoQuerier is returned, wrapped, by a call given no transaction or
// database (a nil Querier, or a nil *sql.Tx, *sql.DB or *sql.Conn in one).
var ErrNoQuerier = store.ErrNoQuerier

// checkCall refuses a nil querier, naming the call, and a topic or key no
// task can have (checked as Schedule checks them), before any query.
func checkCall(call string, q Querier, topic, key string) error {
	if err := store.CheckQuerier(call, q); err != nil {
		return err
	}
	if err := broker.ValidateTopic(topic); err != nil {
		return fmt.Errorf("outbox: %s: %w", call, err)
	}
	if err := broker.ValidateKey(key); err != nil {
		return fmt.Errorf("outbox: %s: %w", call, err)
	}
	return nil
}
