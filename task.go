package delaybridge

import (
	"context"
	"database/sql"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/scanner"
)

// The types a producer and a handler touch. They are the outbox's and the
// broker's own, named here so a service imports this package and its
// broker adapter only.
type (
	// Task is one "do X at time T": the topic names what to do, the key
	// what to do it to, DueAt when. A (topic, key) has one task.
	Task = outbox.Task
	// TaskInfo is a stored task with its state and history (Client.Get).
	TaskInfo = outbox.TaskInfo
	// State is where a task is in its life (StatePending … StateDead).
	State = outbox.State
	// Message is what a handler gets: the task's topic, key, payload,
	// due time and attempt.
	Message = broker.Message
	// HandlerFunc handles one due task in the transaction that marks it
	// done (Client.Handle).
	HandlerFunc = outbox.HandlerFunc
	// Querier is a *sql.DB, *sql.Tx or *sql.Conn.
	Querier = outbox.Querier
	// ScannerConfig tunes the scanner a Client runs when Config.Scanner
	// is set.
	ScannerConfig = scanner.Config
	// BusinessSource is a scanner's query over the business's own table,
	// for rows whose task was never written (ScannerConfig.Business).
	BusinessSource = scanner.Business
)

// The task states, as stored in delay_task.state.
const (
	StatePending   = outbox.StatePending
	StatePublished = outbox.StatePublished
	StateDone      = outbox.StateDone
	StateCancelled = outbox.StateCancelled
	StateDead      = outbox.StateDead
)

// The errors a caller tests with errors.Is.
var (
	// ErrDuplicate: Schedule found a task with this (topic, key).
	ErrDuplicate = outbox.ErrDuplicate
	// ErrNotFound: no task with this (topic, key).
	ErrNotFound = outbox.ErrNotFound
	// ErrFinished: the task is done or cancelled and cannot change, so
	// Cancel and Reschedule come too late.
	ErrFinished = outbox.ErrFinished
	// ErrSchemaBehind: the database lacks a migration this code ships
	// (Migrate, or delaybridge migrate).
	ErrSchemaBehind = outbox.ErrSchemaBehind
	// ErrTopologyMismatch: a live relay or consumer uses another prefix,
	// group or ladder (Client.Start).
	ErrTopologyMismatch = outbox.ErrTopologyMismatch
)

// Permanent marks a handler's error as final: the task goes dead at once
// instead of being retried.
func Permanent(err error) error { return broker.Permanent(err) }

// Snooze is what a handler returns for "not yet, look again after d": the
// payment channel still says pending, say. The task moves to now plus d
// in the handler's transaction, which commits; it is not a failed attempt.
// The reason is kept on the task (its last error). A task may snooze 100
// times; the next snooze sends it to dead.
func Snooze(d time.Duration, reason string) error { return outbox.Snooze(d, reason) }

// Migrate creates the outbox table or brings it up to this version, and
// returns the migrations it applied. It is safe to run from several
// processes at once.
func Migrate(ctx context.Context, db *sql.DB) ([]int, error) { return outbox.Migrate(ctx, db) }
