package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

// untouchable is a Querier no call may reach: bad input is refused first.
type untouchable struct{ t *testing.T }

func (u untouchable) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	u.t.Fatal("a query ran for input that should have been refused")
	return nil, nil
}

func (u untouchable) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	u.t.Fatal("a query ran for input that should have been refused")
	return nil, nil
}

func (u untouchable) QueryRowContext(context.Context, string, ...any) *sql.Row {
	u.t.Fatal("a query ran for input that should have been refused")
	return nil
}

// No transaction or database (nil, or a nil *sql.Tx or *sql.DB in the
// interface) is an error naming the call, not a panic.
func TestCalls_WithoutATransactionOrDatabaseAreErrors(t *testing.T) {
	ctx := context.Background()
	due := time.Now().Add(time.Hour)
	task := outbox.Task{Topic: "t", Key: "k", DueAt: due}
	for _, q := range []outbox.Querier{nil, (*sql.Tx)(nil), (*sql.DB)(nil), (*sql.Conn)(nil)} {
		calls := map[string]error{}
		_, calls["Schedule"] = outbox.Schedule(ctx, q, task)
		calls["ScheduleMany"] = outbox.ScheduleMany(ctx, q, []outbox.Task{task})
		calls["Cancel"] = outbox.Cancel(ctx, q, "t", "k")
		calls["Reschedule"] = outbox.Reschedule(ctx, q, "t", "k", due)
		_, calls["Get"] = outbox.Get(ctx, q, "t", "k")
		_, calls["Overdue"] = outbox.Overdue(ctx, q, "t", "k")
		calls["Replay"] = outbox.Replay(ctx, q, "t", "k")
		_, calls["ListDead"] = ops.ListDead(ctx, q, 10)
		_, calls["Search"] = ops.Search(ctx, q, ops.SearchQuery{})
		for call, err := range calls {
			if !errors.Is(err, outbox.ErrNoQuerier) {
				t.Errorf("%s with %T(nil): err = %v, want ErrNoQuerier", call, q, err)
			}
		}
	}
}

// A topic or key no task can have is refused as Schedule refuses it, before
// any query, rather than looked up and reported missing.
func TestCalls_RefuseATopicOrKeyNoTaskCanHave(t *testing.T) {
	ctx := context.Background()
	q := untouchable{t}
	for _, c := range []struct{ topic, key string }{{"a b", "k"}, {"", "k"}, {"t", ""}} {
		calls := map[string]error{}
		calls["Cancel"] = outbox.Cancel(ctx, q, c.topic, c.key)
		calls["Reschedule"] = outbox.Reschedule(ctx, q, c.topic, c.key, time.Now().Add(time.Hour))
		_, calls["Get"] = outbox.Get(ctx, q, c.topic, c.key)
		_, calls["Overdue"] = outbox.Overdue(ctx, q, c.topic, c.key)
		calls["Replay"] = outbox.Replay(ctx, q, c.topic, c.key)
		for call, err := range calls {
			if !errors.Is(err, broker.ErrInvalidTopic) && !errors.Is(err, broker.ErrInvalidKey) {
				t.Errorf("%s(%q, %q): err = %v, want ErrInvalidTopic or ErrInvalidKey", call, c.topic, c.key, err)
			}
		}
	}
}
