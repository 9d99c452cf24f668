package rabbit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// freezeUp holds what the client sends from now on, and lets the broker's
// frames (its heartbeats) through: a broker that stopped reading a
// connection, as one does for a publisher while a memory or disk alarm
// blocks it.
func (p *gateProxy) freezeUp() {
	p.mu.Lock()
	p.frozen[up], p.held[up] = true, 0
	p.mu.Unlock()
}

// Close returns while the broker reads nothing of the connection: it fails
// what is unconfirmed and closes the socket under the connection rather
// than wait for a close-ok that comes only when the alarm ends (hours for
// a disk alarm), which held a stopping daemon until it was killed.
func TestPublisher_CloseReturnsWhileTheBrokerStopsReading(t *testing.T) {
	b := setup(t)
	// Heartbeats every minute: the broker does not give up on the silent
	// connection within this test, as it does not on one it blocked.
	b.cfg.Heartbeat = time.Minute
	topic := "blocked"
	pub, proxy := proxiedPublisher(t, b, topic, DefaultConfirmWindow)
	proxy.freezeUp()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, guardMsgs(topic, "b", 50)...); err == nil {
		t.Fatal("Publish through a connection the broker does not read succeeded")
	}
	proxy.waitHeld(t, up)
	closed := make(chan struct{})
	began := time.Now()
	go func() { _ = pub.Close(); close(closed) }()
	select {
	case <-closed:
		t.Logf("Close returned after %v", time.Since(began).Round(100*time.Millisecond))
	case <-time.After(45 * time.Second):
		t.Fatal("Close still waits on a broker that does not read the connection")
	}
}

// endsAfterFirstCheck is a context that reports itself live to the first
// Err call and ended to everything after: the caller's deadline passing
// between the publish loop's check and its publish, as it does when the
// check is followed by a topic's declaration on a slow broker.
type endsAfterFirstCheck struct {
	context.Context
	checked atomic.Bool
	done    chan struct{}
}

func (c *endsAfterFirstCheck) Err() error {
	if c.checked.CompareAndSwap(false, true) {
		close(c.done)
		return nil
	}
	return context.DeadlineExceeded
}

func (c *endsAfterFirstCheck) Done() <-chan struct{} { return c.done }

// warnings keeps the messages of the warnings logged.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, r.Message)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

// A caller whose context ends after the publish loop checked it does not
// take the publisher's connection down: the message goes out on the
// channel as it is, and other callers' unconfirmed messages are not failed
// with it. Handing the context to the client made its end look like a
// lost channel: every pending confirm failed and the connection was
// closed and dialled again.
func TestPublisher_ACallersContextEndingMidPublishKeepsTheConnection(t *testing.T) {
	b := setup(t)
	b.cfg.Channels = 1
	log := &warnings{}
	b.cfg.Logger = slog.New(log)
	topic := "ctxend"
	pub, _ := b.clients(t, topic)
	ctx := &endsAfterFirstCheck{Context: context.Background(), done: make(chan struct{})}
	// The caller's own wait sees its context end; the message was sent.
	_ = pub.Publish(ctx, &broker.Message{Topic: topic, Key: "late-caller", DeliverAt: broker.MillisUTC(time.Now())})
	live, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pub.Publish(live, &broker.Message{Topic: topic, Key: "next", DeliverAt: broker.MillisUTC(time.Now())}); err != nil {
		t.Fatalf("the next publish: %v", err)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, w := range log.list {
		if strings.Contains(w, "lost its channel") {
			t.Fatalf("a caller's context ending took the connection down: %q", log.list)
		}
	}
}

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
