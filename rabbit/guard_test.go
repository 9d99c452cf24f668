package rabbit

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/url"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// Tests for the guards that keep the adapter's promises: Publish returns
// nil only for what the broker confirmed, a delivery is acked only when
// the runtime acks it, and nothing leaves the broker before it is due.
// Each was written for a guard whose removal no other test noticed.

// gateProxy forwards TCP connections to the broker and can freeze them:
// while frozen it keeps reading what is sent and holds all of it, and
// thawed it writes what it held in one piece. So a publisher's frames can
// be written without reaching the broker, or the broker's answers to many
// publishes can arrive at once, without a broker being stopped. cut resets
// every connection through it.
type gateProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond
	frozen [2]bool // by direction: up (client to broker), down
	held   [2]int  // bytes held by direction since the freeze
	epoch  uint64  // bumped by cut: pipes of an older epoch end
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// The directions of a gateProxy.
const (
	up   = 0
	down = 1
)

func newGateProxy(t *testing.T, target string) *gateProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &gateProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.thaw()
		p.wg.Wait()
	})
	return p
}

// url returns raw with its host replaced by the proxy's address.
func (p *gateProxy) url(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *gateProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		epoch := p.epoch
		p.mu.Unlock()
		p.pipe(server, client, epoch, up)
		p.pipe(client, server, epoch, down)
	}
}

// pipe copies src to dst through a queue: one goroutine reads src into
// it, another writes all of it to dst whenever dir is not frozen.
func (p *gateProxy) pipe(dst, src net.Conn, epoch uint64, dir int) {
	var queue []byte
	ended := false
	end := func() {
		p.mu.Lock()
		ended = true
		delete(p.conns, src)
		delete(p.conns, dst)
		p.cond.Broadcast()
		p.mu.Unlock()
		_ = src.Close()
		_ = dst.Close()
	}
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			p.mu.Lock()
			queue = append(queue, buf[:n]...)
			if p.frozen[dir] {
				p.held[dir] += n
			}
			p.cond.Broadcast()
			p.mu.Unlock()
			if err != nil {
				end()
				return
			}
		}
	}()
	go func() {
		defer p.wg.Done()
		for {
			p.mu.Lock()
			for !ended && p.epoch == epoch && (p.frozen[dir] || len(queue) == 0) {
				p.cond.Wait()
			}
			if ended || p.epoch != epoch {
				p.mu.Unlock()
				end()
				return
			}
			out := queue
			queue = nil
			p.mu.Unlock()
			if _, err := dst.Write(out); err != nil {
				end()
				return
			}
		}
	}()
}

// freeze holds every byte from now on, in both directions.
func (p *gateProxy) freeze() {
	p.mu.Lock()
	p.frozen, p.held = [2]bool{true, true}, [2]int{}
	p.mu.Unlock()
}

// freezeDown holds what the broker sends from now on.
func (p *gateProxy) freezeDown() {
	p.mu.Lock()
	p.frozen[down], p.held[down] = true, 0
	p.mu.Unlock()
}

// thaw lets the held bytes and everything after them through.
func (p *gateProxy) thaw() {
	p.mu.Lock()
	p.frozen = [2]bool{}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// cut resets every connection open through the proxy and drops what it
// held for them; new connections are accepted.
func (p *gateProxy) cut() {
	p.mu.Lock()
	p.epoch++
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// waitHeld waits until the proxy holds bytes sent in direction dir, and a
// little longer for the rest of what was sent with them.
func (p *gateProxy) waitHeld(t *testing.T, dir int) {
	t.Helper()
	if !testutil.Eventually(10*time.Second, 5*time.Millisecond, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.held[dir] > 0
	}) {
		t.Fatal("nothing was sent while the proxy was frozen")
	}
	time.Sleep(200 * time.Millisecond)
}

// proxiedPublisher returns a Publisher of one channel connected through a
// new gateProxy, with topic's queue declared by a first confirmed publish.
// Its cleanup thaws the proxy first, so Close does not wait on held frames.
func proxiedPublisher(t *testing.T, b *bundle, topic string, window int) (*Publisher, *gateProxy) {
	t.Helper()
	b.topic(topic)
	u, err := url.Parse(b.cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newGateProxy(t, u.Host)
	cfg := b.cfg
	cfg.URL = proxy.url(t, b.cfg.URL)
	cfg.Channels = 1
	cfg.ConfirmWindow = window
	pub, err := NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatalf("NewPublisher through the proxy: %v", err)
	}
	t.Cleanup(func() { proxy.thaw(); _ = pub.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, &broker.Message{Topic: topic, Key: "warm", DeliverAt: time.Now()}); err != nil {
		t.Fatalf("warm-up Publish: %v", err)
	}
	return pub, proxy
}

func guardMsgs(topic, prefix string, n int) []*broker.Message {
	msgs := make([]*broker.Message, n)
	for i := range msgs {
		msgs[i] = &broker.Message{Topic: topic, Key: fmt.Sprintf("%s-%d", prefix, i), DeliverAt: broker.MillisUTC(time.Now())}
	}
	return msgs
}

// A connection that dies while messages await their confirms fails each of
// them with ErrConnectionLost: the broker never saw them (the proxy held
// their frames), so a nil would lose them for good.
func TestPublisher_CutConnectionFailsEveryUnconfirmedMessage(t *testing.T) {
	b := setup(t)
	topic := "cut"
	pub, proxy := proxiedPublisher(t, b, topic, DefaultConfirmWindow)
	proxy.freeze()
	msgs := guardMsgs(topic, "held", 20)
	res := make(chan error, 1)
	go func() { res <- pub.Publish(context.Background(), msgs...) }()
	proxy.waitHeld(t, up)
	proxy.cut()
	proxy.thaw()
	var err error
	select {
	case err = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("Publish did not return after its connection was reset")
	}
	for i, err := range broker.PublishResults(err, len(msgs)) {
		if !errors.Is(err, ErrConnectionLost) {
			t.Errorf("#%d, never confirmed: err = %v, want ErrConnectionLost", i, err)
		}
	}
	// The publisher reconnects and confirms again.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, guardMsgs(topic, "after", 3)...); err != nil {
		t.Errorf("Publish after the reconnect: %v", err)
	}
}

// Publish returns when its context ends, confirmed or not: an error for a
// call still waiting for its confirms and for one still waiting for a free
// channel, never nil.
func TestPublisher_ContextEndWhileUnconfirmedIsAnError(t *testing.T) {
	b := setup(t)
	topic := "timeout"
	// A window of one: the first message of a call fills it and keeps the
	// channel busy with that call.
	pub, proxy := proxiedPublisher(t, b, topic, 1)
	proxy.freeze()
	ctxA, cancelA := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancelA()
	a := guardMsgs(topic, "a", 2)
	resA := make(chan error, 1)
	go func() { resA <- pub.Publish(ctxA, a...) }()
	proxy.waitHeld(t, up)

	ctxB, cancelB := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelB()
	errB := pub.Publish(ctxB, guardMsgs(topic, "b", 1)...)
	if !errors.Is(errB, context.DeadlineExceeded) {
		t.Errorf("Publish that never got a channel = %v, want an error matching context.DeadlineExceeded", errB)
	}
	var errA error
	select {
	case errA = <-resA:
	case <-time.After(30 * time.Second):
		t.Fatal("Publish did not return when its context ended")
	}
	for i, err := range broker.PublishResults(errA, len(a)) {
		if err == nil {
			t.Errorf("a#%d: reported confirmed, but no confirm ever came", i)
		}
	}
	if !errors.Is(errA, context.DeadlineExceeded) {
		t.Errorf("Publish waiting for confirms = %v, want an error matching context.DeadlineExceeded", errA)
	}
}

// Close fails what still awaits its confirm with ErrClosed.
func TestPublisher_CloseFailsWhatAwaitsItsConfirm(t *testing.T) {
	b := setup(t)
	topic := "closing"
	pub, proxy := proxiedPublisher(t, b, topic, DefaultConfirmWindow)
	proxy.freeze()
	msgs := guardMsgs(topic, "c", 3)
	res := make(chan error, 1)
	go func() { res <- pub.Publish(context.Background(), msgs...) }()
	proxy.waitHeld(t, up)
	closed := make(chan struct{})
	go func() { _ = pub.Close(); close(closed) }()
	var err error
	select {
	case err = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("Publish did not return when the Publisher closed")
	}
	for i, err := range broker.PublishResults(err, len(msgs)) {
		if !errors.Is(err, broker.ErrClosed) {
			t.Errorf("#%d, unconfirmed at Close: err = %v, want ErrClosed", i, err)
		}
	}
	proxy.cut() // Close waits for the broker's close-ok, which the proxy holds
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return")
	}
}

// unroutable makes topic's messages come back to a mandatory publish: it
// declares topic's queue through pub (one channel, which will not declare
// it again), then deletes it and the parking queue behind the delivery
// exchange's alternate exchange.
func unroutable(t *testing.T, b *bundle, pub *Publisher, topic string) {
	t.Helper()
	b.topic(topic)
	if err := pub.Publish(context.Background(), &broker.Message{Topic: topic, Key: "warm", DeliverAt: time.Now()}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	topo := topology{cfg: b.cfg}
	ch := b.channel(t)
	for _, q := range []string{topo.topicQueue(topic), topo.parkingQueue()} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Fatalf("delete %s: %v", q, err)
		}
	}
}

// The broker acks a returned message too, right after its basic.return; a
// confirm settled before that return is read would report an unroutable
// message confirmed. The proxy holds the broker's answers to a whole
// window of publishes and lets them through at once, so returns and
// confirms pile up together, which is when the order they are read in
// matters.
func TestPublisher_EveryReturnedMessageFailsUnroutable(t *testing.T) {
	b := setup(t)
	pub, proxy := proxiedPublisher(t, b, "kept", DefaultConfirmWindow)
	// Three bursts: the order the owner goroutine reads them in is random.
	// A topic each: after a return the publisher declares the queue again.
	for round := range 3 {
		lost := fmt.Sprintf("lost-%d", round)
		unroutable(t, b, pub, lost)
		var msgs []*broker.Message
		// Routable ones only at the end: each confirm without a return
		// ahead of it would let the returns get ahead of the confirms.
		for i := range DefaultConfirmWindow - 1 {
			topic := lost
			if i >= DefaultConfirmWindow-10 {
				topic = "kept"
			}
			msgs = append(msgs, &broker.Message{Topic: topic, Key: fmt.Sprint(i), DeliverAt: broker.MillisUTC(time.Now())})
		}
		proxy.freezeDown()
		res := make(chan error, 1)
		go func() { res <- pub.Publish(context.Background(), msgs...) }()
		proxy.waitHeld(t, down)
		// On one processor the library's reader, which never blocks on
		// the buffered notification channels, hands over a large part of
		// the burst before the owner goroutine runs again.
		procs := runtime.GOMAXPROCS(1)
		proxy.thaw()
		var err error
		select {
		case err = <-res:
		case <-time.After(30 * time.Second):
			runtime.GOMAXPROCS(procs)
			t.Fatal("Publish did not return")
		}
		runtime.GOMAXPROCS(procs)
		bad, returned := 0, 0
		for i, err := range broker.PublishResults(err, len(msgs)) {
			switch {
			case msgs[i].Topic == lost:
				returned++
				if !errors.Is(err, ErrUnroutable) {
					if bad++; bad <= 3 {
						t.Errorf("round %d, #%d (returned): err = %v, want ErrUnroutable", round, i, err)
					}
				}
			case err != nil:
				t.Errorf("round %d, #%d (routable): err = %v, want confirmed", round, i, err)
			}
		}
		if bad > 0 {
			t.Fatalf("round %d: %d of %d returned messages not reported unroutable", round, bad, returned)
		}
	}
}

// PublishError.Failed is indexed by the caller's messages: messages refused
// before the wire must not shift the broker's answers onto their
// neighbours, and each refused one is failed itself.
func TestPublisher_PublishErrorKeepsEachMessagesOwnResult(t *testing.T) {
	b := setup(t)
	b.cfg.Channels = 1
	pub, _ := b.clients(t, "fine")
	unroutable(t, b, pub, "nowhere")
	now := broker.MillisUTC(time.Now())
	msgs := []*broker.Message{
		{Topic: "fine", Key: "", DeliverAt: now}, // no key
		{Topic: "nowhere", Key: "returned", DeliverAt: now},
		{Topic: "fine", Key: "ok", DeliverAt: now},
		{Topic: "fine", Key: "no-due"}, // no DeliverAt
		{Topic: "nowhere", Key: "returned-2", DeliverAt: now},
		{Topic: "fine", Key: "ok-2", DeliverAt: now},
	}
	errs := broker.PublishResults(pub.Publish(context.Background(), msgs...), len(msgs))
	for i, want := range []error{broker.ErrRejected, ErrUnroutable, nil, broker.ErrRejected, ErrUnroutable, nil} {
		if want == nil && errs[i] != nil || want != nil && !errors.Is(errs[i], want) {
			t.Errorf("#%d (%s/%q): err = %v, want %v", i, msgs[i].Topic, msgs[i].Key, errs[i], want)
		}
		// The refused messages can never be published and are permanent;
		// the returned ones are temporary, so the relay backs them off
		// rather than marking them dead.
		if perm := broker.IsPermanent(errs[i]); want != nil && perm != errors.Is(want, broker.ErrRejected) {
			t.Errorf("#%d (%s/%q): err = %v, permanent %v; want permanent only for the refused", i, msgs[i].Topic, msgs[i].Key, errs[i], perm)
		}
	}
}

// A topic whose queue the publisher cannot declare (one of the same name
// with other arguments exists) fails its messages; they were never
// published. The channel survives for the other topics.
func TestPublisher_UndeclarableTopicQueueFailsItsMessages(t *testing.T) {
	b := setup(t)
	b.cfg.Channels = 1
	pub, _ := b.clients(t, "other")
	b.topic("clash")
	ch := b.channel(t)
	// A classic queue: the publisher declares a quorum queue of that name.
	if _, err := ch.QueueDeclare(topology{cfg: b.cfg}.topicQueue("clash"), true, false, false, false, nil); err != nil {
		t.Fatalf("declare the clashing queue: %v", err)
	}
	msgs := []*broker.Message{
		{Topic: "clash", Key: "k", DeliverAt: broker.MillisUTC(time.Now())},
		{Topic: "other", Key: "k", DeliverAt: broker.MillisUTC(time.Now())},
	}
	errs := broker.PublishResults(pub.Publish(context.Background(), msgs...), len(msgs))
	if errs[0] == nil {
		t.Error("a message whose topic queue could not be declared was reported confirmed")
	}
	if errs[1] != nil {
		t.Errorf("the other topic's message: %v, want confirmed", errs[1])
	}
}

// Nack gives the delivery back to the queue, Ack removes it.
func TestSubscriber_NackRequeuesAckRemoves(t *testing.T) {
	b := setup(t)
	topic := "nack"
	pub, sub := b.clients(t, topic)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deliveries, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, &broker.Message{Topic: topic, Key: "back", DeliverAt: broker.MillisUTC(time.Now())}); err != nil {
		t.Fatal(err)
	}
	next := func(wait time.Duration) *broker.Delivery {
		select {
		case d := <-deliveries:
			return d
		case <-time.After(wait):
			return nil
		}
	}
	first := next(30 * time.Second)
	if first == nil || first.Message == nil || first.Message.Key != "back" {
		t.Fatalf("first delivery %+v", first)
	}
	if err := first.Acker.Nack(); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	again := next(10 * time.Second)
	if again == nil || again.Message == nil || again.Message.Key != "back" {
		t.Fatalf("after the Nack got %+v, want the message back", again)
	}
	if err := again.Acker.Ack(); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if d := next(500 * time.Millisecond); d != nil {
		t.Fatalf("delivered again after its Ack: %+v", d)
	}
	q, err := b.channel(t).QueueDeclarePassive(topology{cfg: b.cfg}.topicQueue(topic), true, false, false, false, quorum(nil))
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 0 {
		t.Errorf("%d messages left in the queue after the Ack", q.Messages)
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
