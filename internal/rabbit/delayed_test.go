package rabbit

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// delayedSetup is setup for delayed-exchange mode on the real plugin: it
// fails under CI=true (skips elsewhere) when the broker has none.
func delayedSetup(t *testing.T) *bundle {
	t.Helper()
	testenv.DelayedPlugin(t)
	b := setup(t)
	b.cfg.Mode = ModeDelayedExchange
	return b
}

// A broker without the plugin answers "unknown exchange type"; an exchange
// type no plugin provides gets that answer from the real broker, with or
// without the plugin installed.
func TestDelayedExchange_MissingPluginFailsConstructionNamingLadderMode(t *testing.T) {
	b := setup(t)
	cfg := b.cfg
	cfg.Mode = ModeDelayedExchange
	cfg.delayedType = "x-delayed-message-not-installed"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	present, err := PluginPresent(ctx, cfg)
	if err != nil || present {
		t.Errorf("PluginPresent = %v, %v; want false, nil", present, err)
	}
	pub, err := NewPublisher(ctx, cfg)
	if err == nil {
		_ = pub.Close()
		t.Fatal("NewPublisher succeeded with an exchange type the broker does not have")
	}
	if !errors.Is(err, ErrPluginMissing) || !strings.Contains(err.Error(), "ladder") || !strings.Contains(err.Error(), "unknown exchange type") {
		t.Errorf("err = %v, want ErrPluginMissing naming ladder mode and the broker's answer", err)
	}
	sub, err := NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, err := sub.Subscribe(ctx, "delayed"); !errors.Is(err, ErrPluginMissing) {
		t.Errorf("Subscribe err = %v, want ErrPluginMissing", err)
	}
}

func TestDelayedExchange_PluginPresentOnTheTestBroker(t *testing.T) {
	b := delayedSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	present, err := PluginPresent(ctx, b.cfg)
	if err != nil || !present {
		t.Fatalf("PluginPresent = %v, %v; want true on a broker with the plugin", present, err)
	}
	pub, err := NewPublisher(ctx, b.cfg)
	if err != nil {
		t.Fatalf("NewPublisher in delayed-exchange mode: %v", err)
	}
	_ = pub.Close()
}

// The suite runs on the real plugin with the hop limit cut to 2s, so its
// long-delay case chains several plugin hops.
func TestDelayedExchange_PassesBrokerConformanceSuite(t *testing.T) {
	b := delayedSetup(t)
	b.cfg.delayedMaxHop = 2 * time.Second
	brokertest.TestAdapter(t, b.harness(brokertest.Features{MaxHop: 2 * time.Second, LateBound: time.Second}))
}

// The plugin delivers at once an x-delay past 2^32 − 1 ms; the Publisher
// never sends one, so a task due in 60 days waits in the plugin (its first
// hop is the full 2^32 − 1 ms) instead of arriving now.
func TestDelayedExchange_DelayPastThePluginLimitHopsInsteadOfArrivingAtOnce(t *testing.T) {
	b := delayedSetup(t)
	topic := brokertest.Topic(t)
	b.topic(topic)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub, err := NewPublisher(ctx, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if got := pub.Limits().MaxHop; got != MaxDelayedExchangeHop {
		t.Fatalf("Limits().MaxHop = %v, want the plugin's 2^32-1 ms", got)
	}
	now := time.Now()
	msgs := []*broker.Message{
		{Topic: topic, Key: "far", DeliverAt: broker.MillisUTC(now.Add(60 * 24 * time.Hour)), Payload: []byte("far")},
		{Topic: topic, Key: "near", DeliverAt: broker.MillisUTC(now.Add(1500 * time.Millisecond)), Payload: []byte("near")},
	}
	if err := pub.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	// What the plugin does with one millisecond more than its limit.
	ch := b.channel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	rawAt := time.Now()
	dc, err := ch.PublishWithDeferredConfirm(topology{cfg: b.cfg}.delayedExchange(), topic, false, false, amqp.Publishing{
		Headers: amqp.Table{"x-delay": int64(MaxDelayedExchangeHop/time.Millisecond) + 1}, Body: []byte("over")})
	if err != nil || !dc.Wait() {
		t.Fatalf("raw publish past the limit: %v", err)
	}
	deliveries, err := ch.Consume(topology{cfg: b.cfg}.topicQueue(topic), "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]time.Time{}
	for timeout := time.After(10 * time.Second); got["near"].IsZero(); {
		select {
		case d := <-deliveries:
			got[string(d.Body)] = time.Now()
		case <-timeout:
			t.Fatalf("the 1.5s message did not arrive in 10s; arrived: %v", got)
		}
	}
	// One more second for anything that would follow it.
	for timeout := time.After(time.Second); ; {
		select {
		case d := <-deliveries:
			got[string(d.Body)] = time.Now()
			continue
		case <-timeout:
		}
		break
	}
	// "At once" against the 49 days the header asked for: seconds of
	// slack for a box whose broker stalls on a confirm or an fsync, as a
	// message held for 2^32 ms never arrives in this test at all.
	if got["over"].IsZero() || got["over"].Sub(rawAt) > 5*time.Second {
		t.Errorf("a raw x-delay of 2^32 ms arrived %v after its publish, want at once (the plugin's limit, which the hops work around)", got["over"].Sub(rawAt))
	}
	if !got["far"].IsZero() {
		t.Errorf("the message due in 60 days arrived after %v", got["far"].Sub(now))
	}
	if early := msgs[1].DeliverAt.Sub(got["near"]); early > brokerClockSlack(1500*time.Millisecond) {
		t.Errorf("the 1.5s message arrived %v early", early)
	}
}

func TestDelayedExchange_LimitsHopPastThePluginMaximum(t *testing.T) {
	cfg, err := Config{URL: "amqp://x", Mode: ModeDelayedExchange}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.limits(); l.MaxHop != 4294967295*time.Millisecond {
		t.Errorf("MaxHop %v, want 2^32-1 ms", l.MaxHop)
	}
	x, key, ms := topology{cfg: cfg}.delayedRoute(100*24*time.Hour, "t")
	if x != "delaybridge.delayed" || key != "t" || ms != 4294967295 {
		t.Errorf("delayedRoute = %s %s %d", x, key, ms)
	}
}

// In delayed-exchange mode the plugin holds each message for its x-delay:
// read straight from the topic's queue, none arrives before its due time
// less the mode's precision. (The consumer runtime would hide an early one
// by holding it.)
func TestDelayedExchange_NeverReleasesBeforeDue(t *testing.T) {
	b := delayedSetup(t)
	topic := "early"
	pub, _ := b.clients(t, topic)
	now := time.Now()
	var msgs []*broker.Message
	for _, d := range []time.Duration{150 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1300 * time.Millisecond} {
		msgs = append(msgs, &broker.Message{Topic: topic, Key: d.String(), DeliverAt: broker.MillisUTC(now.Add(d))})
	}
	if err := pub.Publish(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	ch := b.channel(t)
	deliveries, err := ch.Consume(topology{cfg: b.cfg}.topicQueue(topic), "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	precision := pub.Limits().Precision
	for range msgs {
		select {
		case d := <-deliveries:
			at := time.Now()
			m := decodeDelivery(t, d)
			// The broker's clock may run fast after a clock jump
			// (brokerClockSlack).
			if early := m.DeliverAt.Sub(at); early > precision+brokerClockSlack(m.DeliverAt.Sub(now)) {
				t.Errorf("%s: arrived %v before its due time, more than the precision %v", m.Key, early, precision)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("not every message arrived")
		}
	}
}

// A delay past the plugin's hop is sent as the hop itself, never more.
func TestDelayedExchange_RouteNeverExceedsTheHop(t *testing.T) {
	for _, maxHop := range []time.Duration{0, 2 * time.Second} {
		cfg, err := Config{URL: "amqp://u:p@127.0.0.1:5672/", Mode: ModeDelayedExchange, delayedMaxHop: maxHop}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		hop := cfg.delayedHop()
		topo := topology{cfg: cfg}
		for _, d := range []time.Duration{hop + time.Millisecond, hop + time.Second, 2*hop - time.Millisecond, 2 * hop, 1000 * hop} {
			if _, _, ms := topo.delayedRoute(d, "t"); ms != hop.Milliseconds() {
				t.Errorf("hop %v: delayedRoute(%v) x-delay %d ms, want the hop %d", hop, d, ms, hop.Milliseconds())
			}
		}
		if _, _, ms := topo.delayedRoute(-time.Second, "t"); ms != 0 {
			t.Errorf("a past due time: x-delay %d, want 0", ms)
		}
	}
}

// count is how many of the warnings contain sub.
func (w *warnings) count(sub string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.list {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// A process that opens the adapter in delayed-exchange mode (run, a
// Client) says once that the plugin is retired and where the way off it
// is; one in ladder mode says nothing of it.
func TestDelayedExchange_OpeningWarnsOnceThatThePluginIsRetired(t *testing.T) {
	b := delayedSetup(t)
	for _, c := range []struct {
		mode Mode
		want int
	}{{ModeDelayedExchange, 1}, {ModeLadder, 0}} {
		cfg := b.cfg
		cfg.Mode, cfg.Logger = c.mode, nil // the logger Open is given
		w := &warnings{}
		conn, err := New(cfg).Open(context.Background(), slog.New(w), true)
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		if got := w.count("archived upstream"); got != c.want || (c.want == 1 && w.count("docs/brokers.md") != 1) {
			t.Errorf("%v mode: %d retirement warnings %q, want %d naming docs/brokers.md", c.mode, got, w.list, c.want)
		}
	}
}
