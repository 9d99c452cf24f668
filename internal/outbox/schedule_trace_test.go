package outbox_test

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

func TestSchedule_RecordsTheCallersSpanInTheTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background()) //nolint:errcheck
	span := func(name string) (context.Context, string) {
		ctx, sp := tp.Tracer("shop").Start(b.ctx, name)
		sp.End()
		return ctx, broker.TraceOf(ctx)
	}
	trace := func(key string) string {
		t.Helper()
		info, err := outbox.Get(b.ctx, b.db, "order-cancel", key)
		if err != nil {
			t.Fatal(err)
		}
		return info.Task.Trace
	}
	due := time.Now().Add(time.Hour)

	ctx, placed := span("POST /orders")
	if _, err := outbox.Schedule(ctx, b.db, outbox.Task{Topic: "order-cancel", Key: "o1", DueAt: due}); err != nil {
		t.Fatal(err)
	}
	if got := trace("o1"); got != placed || got == "" {
		t.Fatalf("Schedule in a span recorded trace %q, want %q", got, placed)
	}
	// A trace the caller sets (a producer that carries its own) wins.
	own := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if _, err := outbox.Schedule(ctx, b.db, outbox.Task{Topic: "order-cancel", Key: "o2", DueAt: due, Trace: own}); err != nil {
		t.Fatal(err)
	}
	if got := trace("o2"); got != own {
		t.Fatalf("Schedule with Task.Trace set recorded %q, want %q", got, own)
	}
	if _, err := outbox.Schedule(b.ctx, b.db, outbox.Task{Topic: "order-cancel", Key: "o3", DueAt: due}); err != nil {
		t.Fatal(err)
	}
	if got := trace("o3"); got != "" {
		t.Fatalf("Schedule without a span recorded trace %q, want none", got)
	}
	batch, imported := span("import orders")
	if err := outbox.ScheduleMany(batch, b.db, []outbox.Task{{Topic: "order-cancel", Key: "m1", DueAt: due}, {Topic: "order-cancel", Key: "m2", DueAt: due, Trace: own}}); err != nil {
		t.Fatal(err)
	}
	if got1, got2 := trace("m1"), trace("m2"); got1 != imported || got2 != own {
		t.Fatalf("ScheduleMany recorded %q and %q, want %q and %q", got1, got2, imported, own)
	}
	// Reschedule in a span makes that span the task's; without one the
	// task keeps the trace it had.
	moved, movedTrace := span("PUT /orders/o1/timeout")
	if err := outbox.Reschedule(moved, b.db, "order-cancel", "o1", due.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := trace("o1"); got != movedTrace || got == placed {
		t.Fatalf("Reschedule in a span left trace %q, want %q", got, movedTrace)
	}
	if err := outbox.Reschedule(b.ctx, b.db, "order-cancel", "o1", due.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := trace("o1"); got != movedTrace {
		t.Fatalf("Reschedule without a span changed the trace to %q, want %q kept", got, movedTrace)
	}
}
