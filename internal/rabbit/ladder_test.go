package rabbit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

func TestLadder_RouteSpellsWholeUnitsRoundedDown(t *testing.T) {
	topo := topology{cfg: Config{Prefix: "p", Unit: 250 * time.Millisecond, Depth: 4}}
	for _, c := range []struct {
		delay time.Duration
		queue string
		bits  string // bits below the entry level, which needs none; 0s carry no header
	}{
		{0, "p.deliver t", ""},
		{249 * time.Millisecond, "p.deliver t", ""},
		{250 * time.Millisecond, "p.entry p.delay.0", ""},
		{499 * time.Millisecond, "p.entry p.delay.0", ""},
		{1250 * time.Millisecond, "p.entry p.delay.2", "01"},
		{2 * time.Second, "p.entry p.delay.3", "000"},
		{3750 * time.Millisecond, "p.entry p.delay.3", "111"},
		{time.Hour, "p.entry p.delay.3", "111"}, // capped at the top
	} {
		x, k, n := topo.ladderRoute(c.delay, "t")
		q := x + " " + k
		h := amqp.Table{}
		setBits(h, n)
		got := ""
		for k := len(c.bits) - 1; k >= 0; k-- {
			if _, ok := h[bitHeader(k)]; ok {
				got += fmt.Sprint(h[bitHeader(k)])
			} else {
				got += "0"
			}
		}
		if q != c.queue || got != c.bits || len(h) != strings.Count(c.bits, "1") {
			t.Errorf("ladderRoute(%v) = %s %v, want %s bits %s", c.delay, q, h, c.queue, c.bits)
		}
	}
	// With a lead the message leaves that much earlier, then rounds down.
	topo.cfg.Lead = 100 * time.Millisecond
	if _, q, n := topo.ladderRoute(600*time.Millisecond, "t"); q != "p.delay.1" || n != 2 {
		t.Errorf("ladderRoute(600ms) with a 100ms lead = %s %d, want 2 units", q, n)
	}
	if x, q, _ := topo.ladderRoute(340*time.Millisecond, "t"); x != "p.deliver" || q != "t" {
		t.Errorf("ladderRoute(340ms) with a 100ms lead = %s %s, want straight to the delivery exchange", x, q)
	}
}

func TestLadder_EachLevelBindsItsBitToItsQueueAndPassesZeroDown(t *testing.T) {
	topo := topology{cfg: Config{Prefix: "p", Unit: time.Second, Depth: 3}}
	if got := bitArgs(2); got["x-match"] != "all" || got["dlbl-2"] != "1" || len(got) != 2 {
		t.Errorf("level 2 queue binding %v", got)
	}
	if topo.nextExchange(0) != "p.deliver" || topo.nextExchange(2) != "p.ladder.1" {
		t.Errorf("next exchanges %s %s", topo.nextExchange(0), topo.nextExchange(2))
	}
	args := topo.levelArgs(2)
	if args["x-message-ttl"] != int64(4000) || args["x-dead-letter-exchange"] != "p.ladder.1" || args["x-dead-letter-strategy"] != "at-least-once" || args["x-overflow"] != "reject-publish" || args["x-queue-type"] != "quorum" {
		t.Errorf("level 2 args %v", args)
	}
}

func TestConfig_DefaultLadderStaysUnderTheTTLLimit(t *testing.T) {
	cfg, err := Config{URL: "amqp://x"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if top := cfg.Unit << (cfg.Depth - 1); top > MaxLevelTTL {
		t.Errorf("top level TTL %v exceeds %v", top, MaxLevelTTL)
	}
	l := cfg.limits()
	if l.MaxHop != LadderMaxHop(DefaultUnit, DefaultDepth) || l.Precision != DefaultUnit+DefaultLead {
		t.Errorf("limits %+v", l)
	}
	if l.MaxHop < 77*24*time.Hour {
		t.Errorf("default max hop %v is shorter than documented (77 days)", l.MaxHop)
	}
	if _, err := (Config{URL: "amqp://x", Unit: time.Second, Depth: 24}).withDefaults(); err == nil {
		t.Error("a 1s unit with 24 levels (top TTL 97 days) was accepted")
	}
}

// getWithin polls queue with basic.get until a message comes or the wait ends.
func getWithin(t *testing.T, ch *amqp.Channel, queue string, wait time.Duration) (amqp.Delivery, bool) {
	t.Helper()
	var d amqp.Delivery
	ok := testutil.Eventually(wait, 20*time.Millisecond, func() bool {
		var got bool
		var err error
		if d, got, err = ch.Get(queue, false); err != nil {
			t.Fatalf("get %s: %v", queue, err)
		}
		return got
	})
	return d, ok
}

// decodeDelivery reads the delaybridge message out of a raw delivery.
func decodeDelivery(t *testing.T, d amqp.Delivery) *broker.Message {
	t.Helper()
	h, err := fromTable(d.Headers)
	if err != nil {
		t.Fatal(err)
	}
	m, err := broker.Decode(h, d.Body)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	return m
}

// deathCount returns x-death's count for queue, 0 when absent.
func deathCount(h amqp.Table, queue string) int64 {
	deaths, _ := h["x-death"].([]any)
	for _, d := range deaths {
		if tab, ok := d.(amqp.Table); ok && tab["queue"] == queue {
			n, _ := tab["count"].(int64)
			return n
		}
	}
	return 0
}

func TestLadder_RepublishedDeliveryCarriesNoDeathHistory(t *testing.T) {
	b := setup(t)
	topic := "again"
	pub, _ := b.clients(t, topic)
	topo := topology{cfg: b.cfg}
	ch := b.channel(t)
	ctx := context.Background()

	// The lead, one whole unit and a bit: rounded down, it enters level 0.
	m := &broker.Message{Topic: topic, Key: "k", Payload: []byte("p"), DeliverAt: broker.MillisUTC(time.Now().Add(testLead + testUnit + 100*time.Millisecond))}
	if err := pub.Publish(ctx, m); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	d, ok := getWithin(t, ch, topo.topicQueue(topic), 30*time.Second)
	if !ok {
		t.Fatal("the message never left level 0")
	}
	level0 := topo.levelQueue(0)
	if n := deathCount(d.Headers, level0); n != 1 {
		t.Fatalf("after one pass x-death counts %d for %s, want 1 (headers %v)", n, level0, d.Headers)
	}
	got := decodeDelivery(t, d)
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}

	// Through the same level again, as the runtime's hop would send it.
	got.Hop++
	got.DeliverAt = broker.MillisUTC(time.Now().Add(testLead + testUnit + 100*time.Millisecond))
	if err := pub.Publish(ctx, got); err != nil {
		t.Fatalf("re-Publish: %v", err)
	}
	d, ok = getWithin(t, ch, topo.topicQueue(topic), 30*time.Second)
	if !ok {
		t.Fatal("the re-published message never left level 0 (held as a dead-letter cycle?)")
	}
	if n := deathCount(d.Headers, level0); n != 1 {
		t.Errorf("after the re-publish x-death counts %d for %s, want 1: the old history travelled along", n, level0)
	}
	_ = d.Ack(false)
}

func TestLadder_UnroutableMessageDoesNotStallLevel(t *testing.T) {
	b := setup(t)
	// One channel, which will not declare "ghost" again once deleted.
	b.cfg.Channels = 1
	pub, sub := b.clients(t, "good")
	b.topic("ghost")
	topo := topology{cfg: b.cfg}
	ctx := context.Background()
	ch := b.channel(t)

	// Declare ghost's queue through a publish, drain it, then delete it: the
	// next ghost message has nowhere to go when it leaves the ladder.
	if err := pub.Publish(ctx, &broker.Message{Topic: "ghost", Key: "warm", DeliverAt: time.Now()}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if _, err := ch.QueueDelete(topo.topicQueue("ghost"), false, false, false); err != nil {
		t.Fatalf("delete ghost queue: %v", err)
	}
	deliveries, err := sub.Subscribe(ctx, "good")
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	due := broker.MillisUTC(time.Now().Add(testLead + 2*testUnit))
	lost := &broker.Message{Topic: "ghost", Key: "lost", Payload: []byte("lost"), DeliverAt: due}
	good := &broker.Message{Topic: "good", Key: "behind", DeliverAt: due}
	if err := pub.Publish(ctx, lost, good); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	select {
	case d := <-deliveries:
		if d.Message == nil || d.Message.Key != "behind" {
			t.Fatalf("got %+v, want the message behind the unroutable one", d)
		}
		_ = d.Acker.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("the message behind an unroutable one never arrived")
	}
	p, ok := getWithin(t, ch, topo.parkingQueue(), 30*time.Second)
	if !ok {
		t.Fatal("the unroutable message is not in the parking queue")
	}
	if string(p.Body) != "lost" || fmt.Sprint(p.Headers["CC"]) != "[ghost]" {
		t.Errorf("parked %q with CC %v", p.Body, p.Headers["CC"])
	}
	_ = p.Ack(false)
}

func TestPublisher_ReturnedMessageIsReportedFailedAlone(t *testing.T) {
	b := setup(t)
	// One channel: it declared "gone" once and will not declare it again
	// after the test deletes it until a return says the queue is gone; a
	// second channel would.
	b.cfg.Channels = 1
	pub, _ := b.clients(t, "here")
	b.topic("gone")
	topo := topology{cfg: b.cfg}
	ctx := context.Background()
	ch := b.channel(t)
	if err := pub.Publish(ctx, &broker.Message{Topic: "gone", Key: "warm", DeliverAt: time.Now()}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	// Without its queue and without the parking queue behind the alternate
	// exchange, a message for "gone" routes nowhere and comes back.
	for _, q := range []string{topo.topicQueue("gone"), topo.parkingQueue()} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Fatalf("delete %s: %v", q, err)
		}
	}
	var msgs []*broker.Message
	for i := range 6 {
		topic := "here"
		if i%3 == 1 {
			topic = "gone"
		}
		msgs = append(msgs, &broker.Message{Topic: topic, Key: "k", DeliverAt: time.Now()})
	}
	errs := broker.PublishResults(pub.Publish(ctx, msgs...), len(msgs))
	for i, err := range errs {
		if msgs[i].Topic == "gone" && (!errors.Is(err, ErrUnroutable) || broker.IsPermanent(err)) {
			// Temporary: the relay backs the row off until the topic's
			// queue is back, never marks it dead.
			t.Errorf("#%d (unroutable): err = %v (permanent: %v), want a temporary ErrUnroutable", i, err, broker.IsPermanent(err))
		}
		if msgs[i].Topic == "here" && err != nil {
			t.Errorf("#%d (routable): err = %v, want confirmed", i, err)
		}
	}
	// The return told the publisher the queue is gone: the next publish
	// declares it again and is confirmed into it.
	if err := pub.Publish(ctx, &broker.Message{Topic: "gone", Key: "again", DeliverAt: time.Now()}); err != nil {
		t.Fatalf("Publish after the return: %v, want the queue declared again", err)
	}
	if _, ok := getWithin(t, ch, topo.topicQueue("gone"), 10*time.Second); !ok {
		t.Fatal("the message published after the return is not in the declared-again queue")
	}
}

func TestLadder_FullLevelNacksThePublish(t *testing.T) {
	b := setup(t)
	b.cfg.MaxLength = 3
	pub, _ := b.clients(t, "full")
	ctx := context.Background()
	// 8 units enter the top level (2s) and stay there while we publish.
	due := time.Now().Add(8*testUnit + time.Minute/60)
	var ok, nacked int
	for i := range 12 {
		err := broker.PublishResults(pub.Publish(ctx, &broker.Message{Topic: "full", Key: "k", DeliverAt: broker.MillisUTC(due), Hop: i}), 1)[0]
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrNacked) && !broker.IsPermanent(err):
			// Temporary: the relay backs the row off and publishes it
			// again once the queue has room, never marks it dead.
			nacked++
		default:
			t.Fatalf("publish %d: %v (permanent: %v), want nil or a temporary ErrNacked", i, err, broker.IsPermanent(err))
		}
	}
	t.Logf("max-length 3: confirmed %d, nacked %d", ok, nacked)
	if ok < 3 || nacked == 0 {
		t.Errorf("confirmed %d, nacked %d: want the first 3 confirmed and the publishes over the guard nacked", ok, nacked)
	}
}

// TestLadder_EveryDelayTakesExactlyItsUnits sends one message for every
// whole number of units the ladder can hold in one hop and reads each from
// the topic's queue as it arrives: its x-death names the level queues it
// waited in, which must be exactly the set bits of its units (level k
// holds 2^k units), each once. Timing alone could not tell: on a loaded
// box a unit too many hides in the lateness.
func TestLadder_EveryDelayTakesExactlyItsUnits(t *testing.T) {
	b := setup(t)
	topic := "every"
	pub, _ := b.clients(t, topic)
	topo := topology{cfg: b.cfg}
	ch := b.channel(t)
	ctx := context.Background()
	// Up to the top less one, and only delays whose lead plus half a unit
	// still fit in one hop: a hop is capped at MaxHop before the lead comes
	// off, so the top itself is never asked for.
	top := min(1<<testDepth-2, int((LadderMaxHop(testUnit, testDepth)-testLead-testUnit/2)/testUnit))
	if top < 1<<(testDepth-1) {
		t.Fatalf("the test ladder (unit %v, depth %d) is too short for the lead %v to reach its top level", testUnit, testDepth, testLead)
	}
	sent := time.Now()
	var msgs []*broker.Message
	for n := 0; n <= top; n++ {
		// Half a unit past n whole units after the lead: rounds down to n.
		due := sent.Add(testLead + time.Duration(n)*testUnit + testUnit/2)
		msgs = append(msgs, &broker.Message{Topic: topic, Key: fmt.Sprint(n), DeliverAt: broker.MillisUTC(due)})
	}
	if err := pub.Publish(ctx, msgs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	got := map[string]time.Time{}
	routes := map[string]amqp.Table{}
	deadline := time.Now().Add(time.Duration(top)*testUnit + 30*time.Second)
	for len(got) <= top {
		d, ok, err := ch.Get(topo.topicQueue(topic), true)
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if !ok {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d delays arrived", len(got), top+1)
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		key := decodeDelivery(t, d).Key
		if _, dup := got[key]; dup {
			t.Errorf("%s units: delivered twice", key)
		}
		got[key], routes[key] = time.Now(), d.Headers
	}
	for n := 0; n <= top; n++ {
		key := fmt.Sprint(n)
		at, ok := got[key]
		if !ok {
			t.Errorf("%d units: never arrived (got keys %v)", n, slices.Sorted(maps.Keys(got)))
			continue
		}
		if min := time.Duration(n) * testUnit; at.Sub(sent) < min-brokerClockSlack(min) {
			t.Errorf("%d units: arrived after %v, sooner than %v", n, at.Sub(sent), min)
		}
		for k := range testDepth {
			want := int64(n >> k & 1)
			if c := deathCount(routes[key], topo.levelQueue(k)); c != want {
				t.Errorf("%d units: waited %d times in level %d (%s), want %d; x-death %v", n, c, k, topo.levelQueue(k), want, routes[key]["x-death"])
			}
		}
	}
}

// A topic's queue is bounded too: a producer cannot fill the broker
// through a topic nobody consumes.
func TestTopicQueue_FullQueueNacksThePublish(t *testing.T) {
	b := setup(t)
	b.cfg.MaxLength = 3
	pub, _ := b.clients(t, "unread")
	var ok, nacked int
	for i := range 8 {
		err := broker.PublishResults(pub.Publish(context.Background(), &broker.Message{Topic: "unread", Key: fmt.Sprint(i), DeliverAt: broker.MillisUTC(time.Now())}), 1)[0]
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrNacked) && !broker.IsPermanent(err):
			// Temporary: the relay backs the row off and publishes it
			// again once the queue has room, never marks it dead.
			nacked++
		default:
			t.Fatalf("publish %d: %v (permanent: %v), want nil or a temporary ErrNacked", i, err, broker.IsPermanent(err))
		}
	}
	if ok < 3 || nacked == 0 {
		t.Errorf("confirmed %d, nacked %d: want the first 3 confirmed and the publishes over the bound nacked", ok, nacked)
	}
}

// The ladder's units never exceed its top, whatever the delay asked, so a
// message is never routed to a level that does not exist; below one hop,
// the time spent in the ladder is never more than the delay and falls
// short of it by less than Precision.
func TestLadder_UnitsStayWithinTheLadderAndThePrecision(t *testing.T) {
	for _, lead := range []time.Duration{-1, 0, testLead, 3 * testUnit} {
		cfg, err := Config{URL: "amqp://u:p@127.0.0.1:5672/", Prefix: "p", Unit: testUnit, Depth: testDepth, Lead: lead}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		topo, l := topology{cfg: cfg}, cfg.limits()
		top := uint64(1)<<testDepth - 1
		for d := time.Duration(0); d <= 3*l.MaxHop; d += 5 * time.Millisecond {
			n := topo.units(d)
			if n > top {
				t.Fatalf("lead %v: units(%v) = %d, above the top %d", lead, d, n, top)
			}
			_, key, _ := topo.ladderRoute(d, "t")
			if n > 0 && key != topo.levelQueue(bits.Len64(n)-1) {
				t.Fatalf("lead %v: delay %v routes to %s", lead, d, key)
			}
			spent := time.Duration(n) * cfg.Unit
			if spent > d {
				t.Fatalf("lead %v: delay %v spends %v in the ladder", lead, d, spent)
			}
			if d <= l.MaxHop && d-spent >= l.Precision {
				t.Fatalf("lead %v: delay %v spends %v, short by %v, not under the precision %v", lead, d, spent, d-spent, l.Precision)
			}
		}
	}
}
