package rocket

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// fakeProducer answers every send with what answer returns and records
// the messages. A test on it runs without the client, so each answer is
// the one the test chooses.
type fakeProducer struct {
	// answer answers one send; a batch's first message stands for it
	// unless batchAnswer is set.
	answer      func(ctx context.Context, m *primitive.Message) (*primitive.SendResult, error)
	batchAnswer func(ctx context.Context, msgs []*primitive.Message) (*primitive.SendResult, error)

	mu       sync.Mutex
	sent     []*primitive.Message
	requests [][]*primitive.Message
	delays   []int64 // each request's batch delay in ms (setBatchDelay's), 0 for none
}

func (f *fakeProducer) SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error) {
	d, _ := ctx.Value(batchDelayKey{}).(int64)
	f.mu.Lock()
	f.sent = append(f.sent, msgs...)
	f.requests = append(f.requests, msgs)
	f.delays = append(f.delays, d)
	f.mu.Unlock()
	if f.batchAnswer != nil {
		return f.batchAnswer(ctx, msgs)
	}
	return f.answer(ctx, msgs[0])
}

func (f *fakeProducer) Shutdown() error { return nil }

func (f *fakeProducer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sent)
}

func sendOK(context.Context, *primitive.Message) (*primitive.SendResult, error) {
	return &primitive.SendResult{Status: primitive.SendOK}, nil
}

// fakePublisher is a Publisher without a lead whose sends go to f.
func fakePublisher(t *testing.T, limits broker.Limits, workers int, f *fakeProducer) *Publisher {
	t.Helper()
	return fakePublisherLead(t, limits, -1, workers, f)
}

// fakePublisherLead is a Publisher with lead (Config.Lead) whose sends go
// to f.
func fakePublisherLead(t *testing.T, limits broker.Limits, lead time.Duration, workers int, f *fakeProducer) *Publisher {
	t.Helper()
	cfg, err := Config{NameServers: []string{"127.0.0.1:1"}, Limits: limits, TrustLimits: true, SendWorkers: workers, Lead: lead}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return &Publisher{cfg: cfg, limits: cfg.hopLimits(), prod: f, routed: map[string]chan struct{}{}, sem: make(chan struct{}, cfg.SendWorkers), now: time.Now}
}

func guardMessage(key string, due time.Time) *broker.Message {
	return &broker.Message{Topic: "t", Key: key, DeliverAt: broker.MillisUTC(due), Payload: []byte("p")}
}

// A send the broker answered with another status than SEND_OK (stored on
// the master, not flushed or not replicated in time) is not confirmed:
// a message sent alone, and every message of a batch.
func TestPublisher_SendStatusOtherThanSendOKFailsThatMessage(t *testing.T) {
	// Timed, each in a slot of its own: each goes alone.
	later := func(i int) time.Time { return time.Now().Add(time.Minute + time.Duration(i)*time.Second) }
	for _, status := range []primitive.SendStatus{primitive.SendFlushDiskTimeout, primitive.SendFlushSlaveTimeout, primitive.SendSlaveNotAvailable, primitive.SendUnknownError} {
		f := &fakeProducer{answer: func(_ context.Context, m *primitive.Message) (*primitive.SendResult, error) {
			if m.GetProperty(propKeys) == "bad" {
				return &primitive.SendResult{Status: status}, nil
			}
			return &primitive.SendResult{Status: primitive.SendOK}, nil
		}}
		p := fakePublisher(t, TimerLimits(time.Hour, time.Second), 4, f)
		msgs := []*broker.Message{guardMessage("good", later(0)), guardMessage("bad", later(1)), guardMessage("good-2", later(2))}
		errs := broker.PublishResults(p.Publish(context.Background(), msgs...), len(msgs))
		if errs[0] != nil || errs[2] != nil {
			t.Errorf("status %d: the SEND_OK messages failed: %v, %v", status, errs[0], errs[2])
		}
		if errs[1] == nil {
			t.Errorf("status %d: reported confirmed", status)
		}

		// Due now, the three go in one batch, which the broker stored
		// (or not) as one: none of them is confirmed.
		p = fakePublisher(t, TimerLimits(time.Hour, time.Second), 4, f)
		msgs = []*broker.Message{guardMessage("bad", time.Now()), guardMessage("good", time.Now()), guardMessage("good-2", time.Now())}
		for i, err := range broker.PublishResults(p.Publish(context.Background(), msgs...), len(msgs)) {
			if err == nil {
				t.Errorf("status %d: message %d of the batch reported confirmed", status, i)
			}
		}
	}
}

// Messages due now go out in batches of at most maxSendBatch, one topic a
// batch, each message with its own properties and id and no delay
// property; timed ones and large ones go alone.
func TestPublisher_DueMessagesGoInBatchesTimedOnesAlone(t *testing.T) {
	f := &fakeProducer{answer: sendOK}
	p := fakePublisher(t, TimerLimits(time.Hour, 100*time.Millisecond), 4, f)
	now := time.Now()
	var msgs []*broker.Message
	for i := range maxSendBatch + 3 {
		msgs = append(msgs, guardMessage("a-"+strconv.Itoa(i), now.Add(-time.Second)))
	}
	for i := range 2 {
		m := guardMessage("b-"+strconv.Itoa(i), now.Add(50*time.Millisecond)) // within one precision: due now
		m.Topic = "other"
		msgs = append(msgs, m)
	}
	big := guardMessage("large", now)
	big.Payload = make([]byte, maxBatchedPayload) // the client would compress it alone
	msgs = append(msgs, big, guardMessage("timed", now.Add(time.Minute)))
	if err := p.Publish(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	sizes := map[string][]int{}
	ids := map[string]bool{}
	for _, req := range f.requests {
		keys := ""
		for _, m := range req {
			if m.Topic != req[0].Topic {
				t.Errorf("one batch holds topics %q and %q", req[0].Topic, m.Topic)
			}
			if len(req) > 1 {
				if m.GetProperty(propTimerDelayMS) != "" || m.GetProperty(propDelayLevel) != "" {
					t.Errorf("batched message %s carries a delay", m.GetProperty(propKeys))
				}
				id := m.GetProperty(primitive.PropertyUniqueClientMessageIdKeyIndex)
				if id == "" || ids[id] {
					t.Errorf("batched message %s has id %q (empty or repeated in the call)", m.GetProperty(propKeys), id)
				}
				ids[id] = true
				if _, err := broker.Decode(m.GetProperties(), m.Body); err != nil {
					t.Errorf("batched message %s: %v", m.GetProperty(propKeys), err)
				}
			}
			keys = m.GetProperty(propKeys)
		}
		sizes[keys[:1]] = append(sizes[keys[:1]], len(req))
	}
	if got := sizes["a"]; len(got) != 2 || max(got[0], got[1]) != maxSendBatch || got[0]+got[1] != maxSendBatch+3 {
		t.Errorf("topic t's %d due messages went in sends of %v, want %d and 3", maxSendBatch+3, got, maxSendBatch)
	}
	if got := sizes["b"]; len(got) != 1 || got[0] != 2 {
		t.Errorf("topic other's 2 due messages went in sends of %v, want one of 2", got)
	}
	if got := f.count(); got != len(msgs) {
		t.Errorf("%d messages sent, want %d", got, len(msgs))
	}
	if len(f.requests) != 5 {
		t.Errorf("%d sends, want 2 + 1 batches and the large and the timed message alone", len(f.requests))
	}
}

// In timer mode, timed messages whose hops end in the same slot of the
// wheel go in one batch, which carries the shortest of their delays: no
// message is asked to wait longer than its own plan, nor less than its
// plan less one precision (the consumer holds up to two). Messages of
// other slots go in other batches, and with delay levels each delayed
// message goes alone.
func TestPublisher_TimedMessagesOfOneWheelSlotGoInOneBatch(t *testing.T) {
	const precision = 100 * time.Millisecond
	f := &fakeProducer{answer: sendOK}
	p := fakePublisher(t, TimerLimits(time.Hour, precision), 4, f)
	now := time.Now()
	slotStart := now.Truncate(precision).Add(10 * time.Second)
	var msgs []*broker.Message
	plans := map[string]time.Duration{}
	for i := range 10 {
		// Ten due across one slot (each asks one precision early), three
		// in the slot after.
		m := guardMessage("s-"+strconv.Itoa(i), slotStart.Add(precision+time.Duration(i*9)*time.Millisecond))
		msgs = append(msgs, m)
	}
	for i := range 3 {
		msgs = append(msgs, guardMessage("n-"+strconv.Itoa(i), slotStart.Add(2*precision+time.Duration(i)*time.Millisecond)))
	}
	for _, m := range msgs {
		plans[m.Key] = PlanHop(p.cfg.Limits, time.Now(), m.DeliverAt).Delay
	}
	if err := p.Publish(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int{}
	for r, req := range f.requests {
		d := time.Duration(f.delays[r]) * time.Millisecond
		if len(req) > 1 && d <= 0 {
			t.Errorf("a batch of %d timed messages without a delay", len(req))
		}
		for _, m := range req {
			key := m.GetProperty(propKeys)
			if len(req) > 1 && m.GetProperty(propTimerDelayMS) != "" {
				t.Errorf("%s carries its own delay inside a batch", key)
			}
			if len(req) > 1 && (d > plans[key] || d <= plans[key]-precision-50*time.Millisecond) {
				t.Errorf("%s planned %v went in a batch asking %v", key, plans[key], d)
			}
		}
		sizes[req[0].GetProperty(propKeys)[:1]] += 1
		if len(req) > 1 {
			sizes[req[0].GetProperty(propKeys)[:1]+"-batched"] += len(req)
		}
	}
	// Where the two slots meet the split may move by the milliseconds the
	// test's planning and Publish's lie apart; most go together.
	if sizes["s-batched"] < 8 || sizes["n-batched"] < 2 || len(f.requests) > 4 {
		t.Errorf("sends %v (%d in all); want the slot's ten and the next slot's three each in one batch", sizes, len(f.requests))
	}

	// Levels: every delayed message alone.
	f = &fakeProducer{answer: sendOK}
	p = fakePublisher(t, LevelLimits(DefaultLevels(), 0), 4, f)
	var lv []*broker.Message
	for i := range 5 {
		lv = append(lv, guardMessage("l-"+strconv.Itoa(i), time.Now().Add(7*time.Second)))
	}
	if err := p.Publish(context.Background(), lv...); err != nil {
		t.Fatal(err)
	}
	if len(f.requests) != 5 {
		t.Errorf("%d sends for 5 messages with a delay level, want each alone", len(f.requests))
	}
}

// setBatchDelay gives a batch the delay its context carries, and leaves a
// lone message, or a batch without one, as it was.
func TestSetBatchDelay_OnlyABatchWithADelayGetsOne(t *testing.T) {
	next := func(context.Context, any, any) error { return nil }
	with := context.WithValue(context.Background(), batchDelayKey{}, int64(2500))
	for _, c := range []struct {
		name  string
		batch bool
		ctx   context.Context
		want  string
	}{
		{"batch with a delay", true, with, "2500"},
		{"lone message", false, with, ""},
		{"batch due now", true, context.Background(), ""},
	} {
		m := primitive.NewMessage("t", []byte("b"))
		m.Batch = c.batch
		if err := setBatchDelay(c.ctx, m, &primitive.SendResult{}, next); err != nil {
			t.Fatal(err)
		}
		if got := m.GetProperty(propTimerDelayMS); got != c.want {
			t.Errorf("%s: %s = %q, want %q", c.name, propTimerDelayMS, got, c.want)
		}
	}
}

// Earlier hops (MaxHop) and last hops that end in the same slot go in
// separate batches: an earlier hop's end moves with the time it is
// planned, a last hop's does not.
func TestPublisher_EarlierHopsAndLastHopsBatchApart(t *testing.T) {
	const precision = 100 * time.Millisecond
	f := &fakeProducer{answer: sendOK}
	p := fakePublisher(t, TimerLimits(time.Minute, precision), 4, f)
	now := time.Now()
	// The MaxHop hops end at now + 1m; last hops end one precision before
	// due, so these end at the start of that slot.
	slotStart := now.Add(time.Minute).Truncate(precision)
	var msgs []*broker.Message
	for i := range 3 {
		msgs = append(msgs, guardMessage("far-"+strconv.Itoa(i), now.Add(time.Hour+time.Duration(i)*time.Second)))
		msgs = append(msgs, guardMessage("last-"+strconv.Itoa(i), slotStart.Add(precision)))
	}
	if err := p.Publish(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	if len(f.requests) > 4 {
		t.Fatalf("%d sends for 6 messages: the test's hops fell in different slots", len(f.requests))
	}
	for _, req := range f.requests {
		kind := strings.SplitN(req[0].GetProperty(propKeys), "-", 2)[0]
		for _, m := range req {
			if k := strings.SplitN(m.GetProperty(propKeys), "-", 2)[0]; k != kind {
				t.Errorf("a batch holds %s and %s hops", kind, k)
			}
		}
	}
}

// A batch the broker refused for good (code 13) is sent again message by
// message: only the message it refuses alone fails with ErrRejected, the
// others are confirmed. Without the split one bad message would fail its
// whole batch on every attempt.
func TestPublisher_BatchRefusedForGoodIsSplitSoOnlyTheBadMessageFails(t *testing.T) {
	illegal := errors.New("CODE: 13, DESC: the message is illegal")
	f := &fakeProducer{batchAnswer: func(_ context.Context, msgs []*primitive.Message) (*primitive.SendResult, error) {
		for _, m := range msgs {
			if m.GetProperty(propKeys) == "bad" {
				return nil, illegal
			}
		}
		return &primitive.SendResult{Status: primitive.SendOK}, nil
	}}
	p := fakePublisher(t, TimerLimits(time.Hour, time.Second), 4, f)
	msgs := []*broker.Message{guardMessage("good", time.Now()), guardMessage("bad", time.Now()), guardMessage("good-2", time.Now())}
	errs := broker.PublishResults(p.Publish(context.Background(), msgs...), len(msgs))
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], broker.ErrRejected) {
		t.Errorf("results %v, want nil, ErrRejected, nil", errs)
	}

	// Any other error leaves the whole batch unconfirmed, to be sent again
	// later, and is not multiplied into one send a message.
	f = &fakeProducer{answer: func(context.Context, *primitive.Message) (*primitive.SendResult, error) {
		return nil, errors.New("CODE: 1, DESC: system busy")
	}}
	p = fakePublisher(t, TimerLimits(time.Hour, time.Second), 4, f)
	for i, err := range broker.PublishResults(p.Publish(context.Background(), msgs...), len(msgs)) {
		if err == nil || errors.Is(err, broker.ErrRejected) {
			t.Errorf("#%d: err = %v, want a transient error", i, err)
		}
	}
	if len(f.requests) != 1 {
		t.Errorf("%d sends after a transient batch failure, want 1", len(f.requests))
	}
}

// A message still waiting for a send worker when the context ends was
// never sent: it fails, it is not left out of the result.
func TestPublisher_MessageNotSentBeforeTheContextEndedFails(t *testing.T) {
	f := &fakeProducer{answer: func(ctx context.Context, _ *primitive.Message) (*primitive.SendResult, error) {
		<-ctx.Done() // a broker that never answers
		// Hold the only worker a while longer, so the messages behind it
		// see nothing but the context's end.
		time.Sleep(100 * time.Millisecond)
		return nil, ctx.Err()
	}}
	p := fakePublisher(t, TimerLimits(time.Hour, time.Second), 1, f)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	// Timed, each in a slot of its own: each goes alone.
	later := time.Now().Add(time.Minute)
	msgs := []*broker.Message{guardMessage("a", later), guardMessage("b", later.Add(time.Second)), guardMessage("c", later.Add(2*time.Second))}
	for i, err := range broker.PublishResults(p.Publish(ctx, msgs...), len(msgs)) {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("#%d: err = %v, want context.DeadlineExceeded", i, err)
		}
	}
	if n := f.count(); n != 1 {
		t.Errorf("%d sends with one worker, want 1", n)
	}
}

// A message Validate refuses fails with ErrRejected and is not sent; the
// others are.
func TestPublisher_InvalidMessageFailsWithoutBeingSent(t *testing.T) {
	f := &fakeProducer{answer: sendOK}
	p := fakePublisher(t, TimerLimits(time.Hour, time.Second), 4, f)
	msgs := []*broker.Message{guardMessage("ok", time.Now()), guardMessage("", time.Now()), guardMessage("ok-2", time.Now())}
	errs := broker.PublishResults(p.Publish(context.Background(), msgs...), len(msgs))
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], broker.ErrRejected) {
		t.Errorf("results %v, want nil, ErrRejected, nil", errs)
	}
	if n := f.count(); n != 2 {
		t.Errorf("%d sends, want the 2 valid messages", n)
	}
}

// What goes on the wire: a timer hop's relative delay, at most MaxHop, and
// for the last hop one precision less than what is left until the due time
// (the wheel delivers at the end of a slot: asked for the due time itself,
// it would deliver up to a precision late); no absolute time; in level mode
// a level whose delay does not pass the due time.
func TestPublisher_SentHopWaitsNoLongerThanDueAndNoLessThanPlanned(t *testing.T) {
	f := &fakeProducer{answer: sendOK}
	p := fakePublisher(t, TimerLimits(time.Hour, 100*time.Millisecond), 4, f)
	now := time.Now()
	msgs := []*broker.Message{guardMessage("soon", now.Add(1500*time.Millisecond)), guardMessage("far", now.Add(3*time.Hour)), guardMessage("due", now.Add(-time.Second))}
	if err := p.Publish(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	sent := map[string]map[string]string{}
	for _, m := range f.sent {
		sent[m.GetProperty(propKeys)] = m.GetProperties()
	}
	delay := func(key string) int64 {
		ms, err := strconv.ParseInt(sent[key][propTimerDelayMS], 10, 64)
		if err != nil {
			t.Errorf("%s: %s = %q", key, propTimerDelayMS, sent[key][propTimerDelayMS])
		}
		return ms
	}
	// 1.5 s less the 100 ms precision, less the moments before the send.
	if ms := delay("soon"); ms < 1300 || ms > 1400 {
		t.Errorf("a message due in 1.5s waits %d ms, want 1.4 s (one precision less) at most", ms)
	}
	if ms := delay("far"); ms != time.Hour.Milliseconds() {
		t.Errorf("a message due in 3h waits %d ms, want MaxHop", ms)
	}
	if v, ok := sent["due"][propTimerDelayMS]; ok {
		t.Errorf("a message already due waits %s ms", v)
	}
	for key, props := range sent {
		for _, k := range []string{"TIMER_DELIVER_MS", "TIMER_DELAY_SEC", propDelayLevel} {
			if v, ok := props[k]; ok {
				t.Errorf("%s: timer mode sent %s=%s", key, k, v)
			}
		}
	}

	f = &fakeProducer{answer: sendOK}
	levels := LevelLimits(DefaultLevels(), 0)
	p = fakePublisher(t, levels, 4, f)
	if err := p.Publish(context.Background(), guardMessage("lvl", time.Now().Add(7*time.Second))); err != nil {
		t.Fatal(err)
	}
	lv, err := strconv.Atoi(f.sent[0].GetProperty(propDelayLevel))
	if err != nil || lv < 1 || levels.Levels[lv-1] > 7*time.Second {
		t.Errorf("a message due in 7s sent with %s=%q", propDelayLevel, f.sent[0].GetProperty(propDelayLevel))
	}
	if v := f.sent[0].GetProperty(propTimerDelayMS); v != "" {
		t.Errorf("level mode sent %s=%s", propTimerDelayMS, v)
	}
}

// With a lead, a message due within the lead and a precision goes without
// a delay, in one batch with the other due ones, and a message due later
// asks the wheel for the lead and a precision less than the time left: the
// last seconds of every task are off the wheel. The limits reported carry
// the lead in their precision, so the consumer holds what arrives early.
func TestPublisher_TheLeadKeepsTheLastSecondsOffTheWheel(t *testing.T) {
	f := &fakeProducer{answer: sendOK}
	p := fakePublisherLead(t, TimerLimits(time.Hour, 100*time.Millisecond), 3*time.Second, 4, f)
	now := time.Now()
	msgs := []*broker.Message{guardMessage("due", now.Add(-time.Second)), guardMessage("soon", now.Add(2*time.Second)), guardMessage("edge", now.Add(3*time.Second)), guardMessage("later", now.Add(10*time.Second))}
	if err := p.Publish(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	delays := map[string]string{}
	var batched []string
	for i, req := range f.requests {
		if len(req) > 1 {
			for _, m := range req {
				batched = append(batched, m.GetProperty(propKeys))
			}
			if f.delays[i] != 0 {
				t.Errorf("a batch of due messages asks for %d ms", f.delays[i])
			}
			continue
		}
		delays[req[0].GetProperty(propKeys)] = req[0].GetProperty(propTimerDelayMS)
	}
	slices.Sort(batched)
	if want := []string{"due", "edge", "soon"}; !slices.Equal(batched, want) {
		t.Errorf("batched %v, want the three within the lead, %v, in one batch without delay", batched, want)
	}
	// 10 s less the 3 s lead and the 100 ms precision, less the moments
	// before the send.
	if ms, err := strconv.ParseInt(delays["later"], 10, 64); err != nil || ms < 6700 || ms > 6900 {
		t.Errorf("a message due in 10s asks for %q ms, want 6.9 s (the lead and a precision less) at most", delays["later"])
	}
	if l := p.Limits(); l.Precision != 3100*time.Millisecond || l.Lookahead != 3*time.Second {
		t.Errorf("Limits() precision %v, lookahead %v; want 3.1s (the lead plus the wheel's) and 3s (the lead)", l.Precision, l.Lookahead)
	}
}

// The lead's defaults: DefaultLead, half a short hop, none when negative
// or in level mode, and refused when no timer hop could end before due.
func TestConfig_LeadDefaults(t *testing.T) {
	ns := []string{"127.0.0.1:1"}
	cases := []struct {
		name            string
		cfg             Config
		lead, lookahead time.Duration
		precision       time.Duration
	}{
		{"default", Config{Limits: TimerLimits(time.Hour, time.Second)}, DefaultLead, DefaultLead, DefaultLead + time.Second},
		{"short hop", Config{Limits: TimerLimits(2*time.Second, 100*time.Millisecond)}, time.Second, time.Second, 1100 * time.Millisecond},
		{"none", Config{Limits: TimerLimits(time.Hour, time.Second), Lead: -1}, 0, DefaultLookahead, time.Second},
		{"set", Config{Limits: TimerLimits(time.Hour, 100*time.Millisecond), Lead: 50 * time.Millisecond}, 50 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond},
		{"levels", Config{Limits: LevelLimits(DefaultLevels(), 0)}, 0, DefaultLookahead, LevelPrecision},
	}
	for _, c := range cases {
		c.cfg.NameServers = ns
		got, err := c.cfg.withDefaults()
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		l := got.hopLimits()
		if got.lead() != c.lead || l.Lookahead != c.lookahead || l.Precision != c.precision {
			t.Errorf("%s: lead %v, lookahead %v, precision %v; want %v, %v, %v", c.name, got.lead(), l.Lookahead, l.Precision, c.lead, c.lookahead, c.precision)
		}
	}
	_, err := Config{NameServers: ns, Limits: TimerLimits(2*time.Second, 100*time.Millisecond), Lead: 1900 * time.Millisecond}.withDefaults()
	if err == nil || !strings.Contains(err.Error(), "Config.Lead") {
		t.Errorf("a lead leaving no room in a 2s hop: err %v, want one naming Config.Lead", err)
	}
}
