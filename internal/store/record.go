package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// RecordTimeout bounds recording one claim's outcome, which runs on after
// the claimer's context ended.
const RecordTimeout = 10 * time.Second

// RecordParams says how Record writes down what the publish of a claim did.
type RecordParams struct {
	// Owner and From are the claim's: rows are changed only while Owner
	// holds them in state From.
	Owner int64
	From  string
	// Stamp is when the outcome is recorded (epoch milliseconds).
	Stamp int64
	// Stopping is set when the claimer's context ended during the
	// publish: the rows the broker did not confirm may never have reached
	// it, so they are given back untouched (Release) rather than counted
	// as failures.
	Stopping bool
	// HandedOff says the claim marked the rows published
	// (ClaimSpec.HandOffAt; From is then Published): rows not confirmed go
	// back to pending (MarkHandOffFailed, ReleaseHandOff), and refused
	// ones go dead without a second count of the attempt.
	HandedOff bool
	// Confirmed, when set, records the rows the broker confirmed: the
	// scanner counts a rescue. A hand-off claim has nothing to record.
	Confirmed func(ctx context.Context, ok []Claimed) error
	// RetryInitial, RetryMax and Skew are MarkFailed's backoff for rows
	// whose publish failed for now.
	RetryInitial, RetryMax, Skew time.Duration
	// RefusedPrefix and FailedPrefix begin the reason stored on a row the
	// broker refused for good and on one whose publish failed.
	RefusedPrefix, FailedPrefix string
}

// Record writes down the outcome of publishing batch, results holding one
// error per row as broker.PublishResults gives them, and returns the rows
// by outcome. It runs even when ctx has ended (in a context of its own,
// bounded by RecordTimeout): a rescue left unrecorded would be repeated
// at once, a failed hand-off left published until a rescue. Each row that
// failed or was refused keeps its own error as its reason, one statement
// a reason. Rows it could not record stay as the claim left them, and a
// rescue publishes them again once the lease expired: at worst published
// twice, which the consumer makes harmless.
func Record(ctx context.Context, db *sql.DB, batch []Claimed, results []error, o RecordParams) (ok, failed, refused []Claimed, err error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RecordTimeout)
	defer cancel()
	ok, failed, refused = SplitResults(batch, results)
	var errs []error
	if len(ok) > 0 && o.Confirmed != nil {
		if err := o.Confirmed(rctx, ok); err != nil {
			errs = append(errs, err)
		}
	}
	for reason, rows := range byReason(refused, batch, results, o.RefusedPrefix) {
		if _, err := o.markDead(rctx, db, rows, reason); err != nil {
			errs = append(errs, fmt.Errorf("mark dead: %w", err))
		}
	}
	if o.Stopping {
		if _, err := o.release(rctx, db, failed); err != nil {
			errs = append(errs, fmt.Errorf("release: %w", err))
		}
	} else {
		for reason, rows := range byReason(failed, batch, results, o.FailedPrefix) {
			if _, err := o.markFailed(rctx, db, rows, reason); err != nil {
				errs = append(errs, fmt.Errorf("record failure: %w", err))
			}
		}
	}
	return ok, failed, refused, errors.Join(errs...)
}

func (o RecordParams) markDead(ctx context.Context, db *sql.DB, rows []Claimed, reason string) (int64, error) {
	if o.HandedOff {
		return MarkHandOffDead(ctx, db, o.Owner, rows, o.Stamp, reason)
	}
	return MarkDead(ctx, db, o.Owner, o.From, rows, o.Stamp, reason)
}

func (o RecordParams) release(ctx context.Context, db *sql.DB, rows []Claimed) (int64, error) {
	if o.HandedOff {
		return ReleaseHandOff(ctx, db, o.Owner, rows)
	}
	return Release(ctx, db, o.Owner, o.From, rows)
}

func (o RecordParams) markFailed(ctx context.Context, db *sql.DB, rows []Claimed, reason string) (int64, error) {
	if o.HandedOff {
		return MarkHandOffFailed(ctx, db, o.Owner, rows, o.Stamp, o.RetryInitial, o.RetryMax, reason)
	}
	return MarkFailed(ctx, db, o.Owner, o.From, rows, o.Stamp, o.RetryInitial, o.RetryMax, o.Skew, reason)
}

// byReason groups rows of batch (a subset, sub) by the text of their
// publish error, so one statement records each distinct reason.
func byReason(sub, batch []Claimed, results []error, prefix string) map[string][]Claimed {
	if len(sub) == 0 {
		return nil
	}
	idx := make(map[int64]int, len(batch))
	for i, c := range batch {
		idx[c.Message.TaskID] = i
	}
	out := map[string][]Claimed{}
	for _, c := range sub {
		reason := prefix + results[idx[c.Message.TaskID]].Error()
		out[reason] = append(out[reason], c)
	}
	return out
}
