package rocket

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// Publisher sends delaybridge messages to RocketMQ, one hop at a time, as
// Limits().Plan plans it. It implements broker.Publisher.
//
// # Timing: relative, not absolute
//
// A timer hop carries TIMER_DELAY_MS, a delay the broker counts from the
// moment it stores the message, and never TIMER_DELIVER_MS, an absolute
// epoch time read against the broker's clock. The delay is computed from
// the sender's clock right before each send. This keeps the broker's clock
// out of the picture:
//
//   - With an absolute time, a sender whose clock runs ahead of the
//     broker's by s asks for MaxHop+s when it means MaxHop, and a full
//     hop with MaxHop equal to timerMaxDelaySec is rejected (code 13).
//     A relative delay is compared with the limit as it is.
//   - With an absolute time, a broker whose clock runs ahead of the
//     consumers' by more than the runtime's hold window delivers every
//     message early, the consumer hops it again to the same absolute time,
//     and the broker delivers it at once again: a hot loop until the clocks
//     meet. With a relative delay each hop waits what the hopping consumer
//     computed from its own clock, so an early arrival is corrected by one
//     hold or one hop.
//
// The price is that the time between computing the delay and the broker
// storing the message (send latency, client retries) makes a hop that much
// later; it never makes one earlier. Lateness then depends only on the
// skew between delaybridge's own machines (relay and consumers), which the
// runtime's hold window covers.
//
// The broker's timerPrecisionMs would add up to one precision more: its
// wheel delivers a message at the end of the slot its time falls in. So
// the last hop asks for one precision less than the time left (PlanHop)
// and arrives by the due time, where the consumer holds it until due.
//
// # The lead
//
// The wheel moves one slot's messages into their topics before the next
// slot, so a slot holding a burst keeps every message due after it
// waiting, on every topic. With a lead (Config.Lead) the publisher plans
// with limits whose precision is the wheel's plus the lead (Limits): the
// last hop ends that much before due, and a hop shorter than that goes
// as a plain message, batched with the other due ones. The relay's
// lookahead is the lead, so a task's last seconds are never on the wheel.
//
// # Levels
//
// With Limits.Levels the publisher sends the 1-based level Plan chose in the
// DELAY property. Plan never chooses a level above the last, so the broker
// never clamps one silently.
//
// # Several broker groups
//
// Sends go round-robin over the queues of every group in the topic's route.
// A failed attempt is retried (SendRetries) on another group's queue, so a
// dead master costs a send one refused connection, or one SendTimeout for a
// send already on its way when it died. A group that joins the route (a
// master back from a crash, or a new one) gets no first attempts for its
// first minute: the consumers only read its queues after their own route
// refresh and rebalance, up to about 50 s later, and a message sent there
// before would wait for them. See docs/deployment.md.
//
// # Batches
//
// The messages of one Publish call for one topic that the broker is to
// deliver at the same moment go out in batches of up to maxSendBatch: the
// broker stores a batch in one write and answers once, and the client
// writes one request instead of one a message, so a batch costs both a
// fraction of sending its messages one by one (BENCHMARKS.md, "Relay
// throughput"). That is:
//
//   - messages due now (overdue, due within one precision, or below the
//     smallest level), which carry no delay;
//   - in timer mode, timed messages whose hops end in the same slot of the
//     broker's timer wheel (Limits.Precision): the wheel delivers a slot's
//     messages together at its end anyway. The broker reads a batch's
//     delay from the batch, not from the messages in it, so the batch
//     carries TIMER_DELAY_MS itself (set by an interceptor of the client,
//     which builds the batch), planned right before the send as the
//     shortest of its messages'. Last hops and earlier hops (MaxHop)
//     batch apart. A last hop's end is due less one precision whenever it
//     is planned, so the batch's delay ends in the slot each of its
//     messages' ends in, and each arrives when it would alone; were the
//     broker's slots to fall otherwise, it would still be within two
//     precisions of due, which the consumer holds (its HoldWindow is at
//     least twice the precision).
//
// With delay levels (RocketMQ 4.x) a delayed message goes alone: the broker
// refuses a batch with a level. A batch is stored whole or not at all, so
// its messages succeed or fail together; if the broker refuses a batch for
// good (code 13), each of its messages is sent alone, so only a message the
// broker refuses alone fails for good. A payload of maxBatchedPayload or
// more, or properties above maxBatchedProperties, go alone too: the client
// does not compress a batch, and writes an inner message's properties
// length in 16 bits. A batch of one goes alone.
//
// Each send builds its properties from broker.Encode and the planned hop
// only, never from a received message, so no TIMER_* property of an
// earlier hop can leak into a re-publish.
type Publisher struct {
	cfg    Config
	limits broker.Limits // cfg.hopLimits(): what hops are planned with
	prod   interface {
		SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error)
		Shutdown() error
	}
	sem chan struct{}
	now func() time.Time

	mu       sync.RWMutex
	closed   bool
	inflight sync.WaitGroup

	routesMu sync.Mutex
	routed   map[string]chan struct{} // closed once a first send to the topic returned
}

// Property names the publisher sets besides the envelope.
const (
	propTimerDelayMS = "TIMER_DELAY_MS"
	propDelayLevel   = primitive.PropertyDelayTimeLevel
	propKeys         = primitive.PropertyKeys
	// propEmptyBody marks a message whose payload is empty. The broker
	// cannot store an empty body (it fails with a NullPointerException,
	// code 1), so such a message travels with one zero byte that the
	// subscriber drops again.
	propEmptyBody = "DELAYBRIDGE_EMPTY_BODY"
)

// NewPublisher starts a producer on cfg.NameServers. Close it with Close.
//
// Unless cfg.TrustLimits, it first reads the brokers' limits (see
// Config.Limits) and refuses limits they cannot keep. It takes a context
// like rabbit.NewPublisher: it bounds reading the limits, and a done ctx
// is refused before anything starts.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("rocket: new producer: %w", err)
	}
	if _, err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	cfg, err := resolveLimits(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	installClientLog()
	prod, err := producer.NewDefaultProducer(append([]producer.Option{
		producer.WithNameServer(cfg.NameServers),
		producer.WithGroupName(cfg.ProducerGroup),
		producer.WithInstanceName(instanceName("pub")),
		producer.WithSendMsgTimeout(cfg.SendTimeout),
		producer.WithRetry(cfg.SendRetries),
		producer.WithQueueSelector(newQueueSelector(brokerSettle)),
		producer.WithInterceptor(setBatchDelay),
	}, clientOptions(cfg, producer.WithCredentials, producer.WithTls)...)...)
	if err != nil {
		return nil, fmt.Errorf("rocket: new producer: %w", err)
	}
	if err := prod.Start(); err != nil {
		return nil, fmt.Errorf("rocket: start producer: %w", err)
	}
	return &Publisher{cfg: cfg, limits: cfg.hopLimits(), prod: prod, routed: map[string]chan struct{}{}, sem: make(chan struct{}, cfg.SendWorkers), now: time.Now}, nil
}

// Limits returns the limits hops are planned with: the configured ones,
// with the lead added to the precision in timer mode (Config.Lead).
func (p *Publisher) Limits() broker.Limits { return p.limits }

// Publish sends the messages, up to SendWorkers sends at once, and returns
// when the broker answered for all of them: in batches where they share a
// topic and a delivery time (see Batches above), the others alone. See
// broker.Publisher for the meaning of the result.
func (p *Publisher) Publish(ctx context.Context, msgs ...*broker.Message) error {
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		return broker.ErrClosed
	}
	p.inflight.Add(1)
	p.mu.RUnlock()
	defer p.inflight.Done()

	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	// start runs f on a send worker, or fails the messages at idx when ctx
	// ends first.
	start := func(idx []int, f func()) {
		select {
		case p.sem <- struct{}{}:
		case <-ctx.Done():
			for _, i := range idx {
				errs[i] = ctx.Err()
			}
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-p.sem }()
			f()
		}()
	}
	flush := func(b *sendBatch) {
		idx, ms := b.idx, b.msgs
		if len(idx) == 1 {
			i := idx[0]
			start(idx, func() { errs[i] = p.send(ctx, msgs[i]) })
			return
		}
		start(idx, func() {
			for k, err := range p.sendBatch(ctx, msgs, idx, ms) {
				errs[idx[k]] = err
			}
		})
	}
	batches := map[batchKey]*sendBatch{}
	var alone []int
	now := p.now()
	for i, m := range msgs {
		if err := validate(m); err != nil {
			errs[i] = err
			continue
		}
		if pm, size, key, ok := p.batchable(m, now); ok {
			b := batches[key]
			if b != nil && (len(b.msgs) == maxSendBatch || b.size+size > maxBatchBytes) {
				flush(b)
				b = nil
			}
			if b == nil {
				b = &sendBatch{}
				batches[key] = b
			}
			b.add(i, pm, size)
			continue
		}
		alone = append(alone, i)
	}
	// The rest of the due messages first: they are late already, a
	// timed one is not.
	for key, b := range batches {
		if key.slot == dueNow {
			flush(b)
		}
	}
	for key, b := range batches {
		if key.slot != dueNow {
			flush(b)
		}
	}
	for _, i := range alone {
		start([]int{i}, func() { errs[i] = p.send(ctx, msgs[i]) })
	}
	wg.Wait()

	failed := map[int]error{}
	for i, err := range errs {
		if err != nil {
			failed[i] = err
		}
	}
	switch {
	case len(failed) == 0:
		return nil
	case len(failed) == len(msgs) && len(msgs) > 1 && allSame(errs):
		return errs[0]
	default:
		return &broker.PublishError{Failed: failed}
	}
}

// Batching limits (see Batches in Publisher's documentation).
const (
	// maxSendBatch is the most messages one send carries. A send of 32
	// costs far less than 32 sends, so due messages go many times faster
	// in batches (BENCHMARKS.md, "Relay throughput").
	maxSendBatch = 32
	// maxBatchedPayload is the smallest payload sent alone: the client
	// compresses a lone message's body from 4 KiB on, never a batch's.
	maxBatchedPayload = 4096
	// maxBatchedProperties bounds an inner message's properties, whose
	// length the client writes in 16 bits and the broker reads as a
	// signed short.
	maxBatchedProperties = 16 << 10
	// maxBatchBytes bounds a batch's body, far below the broker's default
	// maxMessageSize of 4 MiB (a broker set below it refuses each batch,
	// which is then sent message by message). Small messages fill a
	// batch long before it.
	maxBatchBytes = 128 << 10
)

// batchKey is what the messages of one batch share: the topic, and the
// slot of the timer wheel their hop ends in, or dueNow.
type batchKey struct {
	topic string
	slot  int64
	last  bool // the hop is the last: an earlier one's end moves with the time it is planned
}

// dueNow is the slot of the messages that carry no delay.
const dueNow = -1

// sendBatch is the messages of one batchKey gathered for one send.
type sendBatch struct {
	idx  []int // their positions in Publish's msgs
	msgs []*primitive.Message
	size int
}

func (b *sendBatch) add(i int, m *primitive.Message, size int) {
	b.idx = append(b.idx, i)
	b.msgs = append(b.msgs, m)
	b.size += size
}

// batchable returns m as the client message a batch carries, with its
// encoded size and the batch it belongs to, when m can go in one: due at
// now (its hop has no delay; planned now without a delay, it has none
// later either, so it is sent no earlier), or in timer mode, timed; and
// small enough. The message carries no delay property of its own: a timed
// batch's is the batch's (sendBatch).
func (p *Publisher) batchable(m *broker.Message, now time.Time) (*primitive.Message, int, batchKey, bool) {
	key := batchKey{topic: m.Topic, slot: dueNow}
	hop := PlanHop(p.limits, now, m.DeliverAt)
	precision := p.cfg.Limits.Precision.Milliseconds()
	switch {
	case len(m.Payload) >= maxBatchedPayload, hop.Level > 0:
		return nil, 0, key, false
	case hop.Delay >= time.Millisecond:
		if precision <= 0 {
			return nil, 0, key, false
		}
		key.slot, key.last = now.Add(hop.Delay).UnixMilli()/precision, hop.Last
	}
	msg := p.message(m, broker.HopPlan{})
	// The client gives a lone message an id (the broker's message id);
	// in a batch each message needs its own, as the Java client sets
	// them. The client's ids repeat after 65,536 in one second, which
	// only blurs a lookup by id; delaybridge never reads them.
	msg.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, primitive.CreateUniqID())
	props := len(msg.MarshallProperties())
	if props > maxBatchedProperties {
		return nil, 0, key, false
	}
	return msg, 22 + len(msg.Body) + props, key, true
}

// batchDelayKey is the context key under which sendBatch hands a timed
// batch's delay, in milliseconds, to setBatchDelay.
type batchDelayKey struct{}

// setBatchDelay is the client interceptor that gives a batch the delay
// sendBatch planned for it: the client builds the batch message inside
// SendSync, and the broker reads TIMER_DELAY_MS from it, not from the
// messages it carries.
func setBatchDelay(ctx context.Context, req, reply any, next primitive.Invoker) error {
	if m, ok := req.(*primitive.Message); ok && m.Batch {
		if ms, ok := ctx.Value(batchDelayKey{}).(int64); ok && ms > 0 {
			m.WithProperty(propTimerDelayMS, strconv.FormatInt(ms, 10))
		}
	}
	return next(ctx, req, reply)
}

// sendBatch sends ms, the messages at idx in msgs, in one request and
// returns each one's result. A batch the broker refused for good is sent
// again message by message, so the message it refused fails alone.
func (p *Publisher) sendBatch(ctx context.Context, msgs []*broker.Message, idx []int, ms []*primitive.Message) []error {
	errs := make([]error, len(ms))
	// The shortest of the messages' hops, planned now, right before the
	// send, as a lone message's is: the broker counts it from its receipt.
	now, delay := p.now(), time.Duration(-1)
	for _, i := range idx {
		if d := PlanHop(p.limits, now, msgs[i].DeliverAt).Delay; delay < 0 || d < delay {
			delay = d
		}
	}
	delay = delay.Truncate(time.Millisecond)
	if delay > 0 {
		ctx = context.WithValue(ctx, batchDelayKey{}, delay.Milliseconds())
	}
	res, err := p.sendSync(ctx, ms...)
	if err == nil && res.Status != primitive.SendOK {
		err = fmt.Errorf("rocket: send: broker answered status %d, not SEND_OK", res.Status)
	} else if err != nil {
		if len(ms) > 1 && responseCode(err) == codeMessageIllegal {
			for k, i := range idx {
				errs[k] = p.send(ctx, msgs[i])
			}
			return errs
		}
		err = classify(err, delay, p.cfg.Limits.MaxHop)
	}
	for k := range errs {
		errs[k] = err
	}
	return errs
}

// allSame reports whether every error is the context's or the same value,
// so one error can stand for all.
func allSame(errs []error) bool {
	for _, e := range errs[1:] {
		if e != errs[0] {
			return false
		}
	}
	return errs[0] != nil && (errors.Is(errs[0], context.Canceled) || errors.Is(errs[0], context.DeadlineExceeded))
}

func validate(m *broker.Message) error {
	if err := m.Validate(); err != nil {
		return errors.Join(broker.ErrRejected, err)
	}
	if strings.ContainsAny(m.Key, "\x01\x02") || strings.ContainsAny(m.Trace, "\x01\x02") {
		return errors.Join(broker.ErrRejected, broker.ErrInvalidMessage, errProperty)
	}
	if len(m.Payload) > broker.MaxBody {
		// Every subscriber refuses it as malformed (the client compresses
		// a body, so the broker's own limit may let it in): published, it
		// would come back from the scanner for ever.
		return fmt.Errorf("%w: payload of %d bytes, more than the %d a consumer accepts", broker.ErrRejected, len(m.Payload), broker.MaxBody)
	}
	for k, v := range m.Headers {
		if strings.ContainsAny(k, "\x01\x02") || strings.ContainsAny(v, "\x01\x02") {
			return errors.Join(broker.ErrRejected, broker.ErrInvalidMessage, errProperty)
		}
	}
	return nil
}

// send plans the hop at the last moment, so the relative delay starts as
// close as possible to the broker's receipt, and sends one message.
func (p *Publisher) send(ctx context.Context, m *broker.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	hop := PlanHop(p.limits, p.now(), m.DeliverAt)
	res, err := p.sendSync(ctx, p.message(m, hop))
	if err != nil {
		return classify(err, hop.Delay.Truncate(time.Millisecond), p.cfg.Limits.MaxHop)
	}
	if res.Status != primitive.SendOK {
		// Stored on the master but not flushed or replicated in time: report
		// it unconfirmed, so the caller sends it again; a duplicate is
		// harmless, a loss is not.
		return fmt.Errorf("rocket: send: broker answered status %d, not SEND_OK", res.Status)
	}
	return nil
}

// message is m as the client sends it for hop.
func (p *Publisher) message(m *broker.Message, hop broker.HopPlan) *primitive.Message {
	props := broker.Encode(m)
	props[propKeys] = m.Key
	setHop(props, hop)
	body := m.Payload
	if len(body) == 0 {
		body = []byte{0}
		props[propEmptyBody] = "1"
	}
	msg := primitive.NewMessage(m.Topic, body)
	msg.WithProperties(props)
	return msg
}

// sendSync sends msgs, all of one topic, in one request. The client looks a topic's route up on its first
// send, and concurrent first sends race inside it: some fail at once with
// "route info not found". So the first send to a topic goes alone and the
// others wait for it; a send that still finds no route (the broker was
// restarting, say) is tried again a few times.
func (p *Publisher) sendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error) {
	topic := msgs[0].Topic
	p.routesMu.Lock()
	ready, seen := p.routed[topic]
	if !seen {
		if len(p.routed) >= broker.MaxTrackedTopics {
			// A producer can name any number of topics; forget the ones
			// already routed (a send finds their route in the client's
			// cache, or waits once more) rather than grow without end.
			for t, ch := range p.routed {
				select {
				case <-ch:
					delete(p.routed, t)
				default:
				}
			}
		}
		ready = make(chan struct{})
		p.routed[topic] = ready
	}
	p.routesMu.Unlock()
	if seen {
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	} else {
		defer close(ready)
	}
	for attempt := 0; ; attempt++ {
		res, err := p.prod.SendSync(ctx, msgs...)
		if err == nil || attempt == routeRetries || !strings.Contains(err.Error(), "route info not found") {
			return res, err
		}
		t := time.NewTimer(routeRetryPause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
	}
}

const (
	routeRetries    = 5
	routeRetryPause = 200 * time.Millisecond
)

// PlanHop is the hop the publisher sends for a message due at due, planned
// at now, with the publisher's limits (Publisher.Limits, the lead in their
// precision). With delay levels it is l.Plan's. With the timer wheel the chain
// is planned toward one precision before due: the wheel delivers a message
// at the end of the slot its time falls in, up to one precision after it,
// so asked for one precision less, the last hop arrives no later than the
// due time, and the consumer holds it until due (its HoldWindow is at least
// twice the precision). Lateness is then the consumer's, not the slot's:
// asked for the due time itself, the last hop arrives up to one precision
// late, half of one on average (BENCHMARKS.md, "RocketMQ adapter"). Every
// hop before the last is a whole MaxHop, as before.
func PlanHop(l broker.Limits, now, due time.Time) broker.HopPlan {
	if len(l.Levels) > 0 {
		return l.Plan(now, due)
	}
	return l.Plan(now, due.Add(-l.Precision))
}

// setHop adds the delay property of hop to props: TIMER_DELAY_MS in timer
// mode, DELAY in level mode, nothing for a hop without delay.
func setHop(props map[string]string, hop broker.HopPlan) {
	switch {
	case hop.Level > 0:
		props[propDelayLevel] = fmt.Sprint(hop.Level)
	case hop.Delay >= time.Millisecond:
		props[propTimerDelayMS] = fmt.Sprint(hop.Delay.Milliseconds())
	}
}

// Close waits for running Publish calls and shuts the producer down.
// Publish after Close returns broker.ErrClosed.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.inflight.Wait()
	return p.prod.Shutdown()
}
