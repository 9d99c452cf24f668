package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/ops"
	"github.com/delaybridge/delaybridge/internal/outbox"
)

func rabbitTopology(prefix string) broker.Topology {
	return broker.Topology{Broker: "rabbit", Settings: map[string]string{"prefix": prefix, "mode": "ladder", "unit": "100ms", "depth": "26"}}
}

func TestUnconsumed_NamesOverdueTopicsWithoutALiveConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := time.Now().Add(-time.Hour)
	for _, k := range []string{"a1", "a2"} {
		b.schedule(t, outbox.Task{Topic: "attended", Key: k, DueAt: old})
	}
	for _, k := range []string{"u1", "u2", "u3"} {
		b.schedule(t, outbox.Task{Topic: "forgotten", Key: k, DueAt: old})
	}
	b.schedule(t, outbox.Task{Topic: "future", Key: "f1", DueAt: time.Now().Add(time.Hour)})
	published := old.Add(time.Second).UnixMilli()
	if _, err := b.db.Exec("UPDATE delay_task SET state = 'published', published_ms = ?", published); err != nil {
		t.Fatal(err)
	}
	c, err := outbox.Announce(b.ctx, b.db, outbox.Presence{Role: outbox.RoleConsumer, Topology: rabbitTopology("delaybridge"), Topics: []string{"attended", "other"}},
		outbox.PresenceConfig{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	got, err := ops.Unconsumed(b.ctx, b.db, time.Now(), 30*time.Second, time.Minute)
	if err != nil || len(got) != 1 || got["forgotten"] != 3 {
		t.Fatalf("Unconsumed = %v, %v; want forgotten: 3", got, err)
	}
	if err := c.Close(b.ctx); err != nil {
		t.Fatal(err)
	}
	got, err = ops.Unconsumed(b.ctx, b.db, time.Now(), 30*time.Second, time.Minute)
	if err != nil || len(got) != 2 || got["attended"] != 2 || got["forgotten"] != 3 {
		t.Fatalf("after the consumer left, Unconsumed = %v, %v; want attended: 2, forgotten: 3", got, err)
	}
}
