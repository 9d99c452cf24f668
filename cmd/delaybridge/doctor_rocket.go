package main

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rocket"
)

func checkRocket(ctx context.Context, a *app, bf *brokerFlags, r *report, probe time.Duration) {
	cfg, err := bf.rocketConfig(a)
	if err != nil {
		r.fail("rocket: %v", err)
		return
	}
	if !checkRocketLimits(ctx, bf, &cfg, r) {
		return
	}
	// The probes measure the wheel itself: with a lead, a short probe
	// would skip it and a long one would ask it for less.
	cfg.Lead = -1
	if err := func() error {
		pub, err := rocket.NewPublisher(ctx, cfg)
		if err != nil {
			return err
		}
		defer pub.Close()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return pub.CreateTopic(cctx, bf.RocketBrokerAddr, doctorTopic, 1)
	}(); err != nil {
		r.fail("RocketMQ at %s: cannot create the probe topic: %v", bf.RocketNameServers, scrub(err, bf.RocketSecretKey))
		return
	}
	r.ok("RocketMQ name server %s routes topic %s on broker %s", bf.RocketNameServers, doctorTopic, bf.RocketBrokerAddr)
	if maxHop := cfg.Limits.MaxHop; len(cfg.Limits.Levels) == 0 {
		// A probe publisher whose own limit never cuts the probe's delay.
		pcfg := cfg
		pcfg.Limits = rocket.TimerLimits(maxHop+time.Hour, cfg.Limits.Precision)
		pub, err := rocket.NewPublisher(ctx, pcfg)
		if err != nil {
			r.fail("rocket publisher: %v", err)
			return
		}
		defer pub.Close()
		// Due a precision after d: the publisher's last timer hop asks
		// the broker for one precision less than the time left, so the
		// broker is asked for d itself (rocket.PlanHop).
		send := func(d time.Duration) error {
			m := &broker.Message{Topic: doctorTopic, Key: "doctor-limit", DeliverAt: broker.MillisUTC(time.Now().Add(d + cfg.Limits.Precision)), Payload: []byte("doctor")}
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return broker.PublishResults(pub.Publish(sctx, m), 1)[0]
		}
		if err := send(maxHop); err != nil {
			var re *rocket.RejectedError
			if errors.As(err, &re) && re.BrokerMaxDelay > 0 {
				r.fail("the broker refuses a hop of the max hop %v: its timerMaxDelaySec is %v; lower --rocketmq-max-delay to it", maxHop, re.BrokerMaxDelay)
			} else {
				r.fail("a timer probe of %v failed: %v", maxHop, err)
			}
		} else {
			r.ok("the broker accepts a timer hop of the max hop %v", maxHop)
			past := maxHop + time.Minute
			if err := send(past); err == nil {
				r.warn("the broker also accepts %v: its timerMaxDelaySec is above max hop %v; raise --rocketmq-max-delay (or leave it unset) to save hops", past, maxHop)
			} else if errors.Is(err, broker.ErrRejected) {
				r.ok("the broker refuses %v: the max hop matches its timerMaxDelaySec", past)
			} else {
				r.warn("probe past the limit failed without a rejection: %v", err)
			}
		}
	}
	measurePrecision(ctx, a, bf, cfg, r, probe)
	r.ok("clock skew with RocketMQ: not measured (timer hops use TIMER_DELAY_MS, relative to the broker's clock, so skew does not move due times)")
}

// measurePrecision asks the broker to deliver one probe after probe and
// reports when it arrived, from that time and from the probe's due time; a
// probe that arrives at once means timers are off.
func measurePrecision(ctx context.Context, a *app, bf *brokerFlags, cfg rocket.Config, r *report, probe time.Duration) {
	pub, err := rocket.NewPublisher(ctx, cfg)
	if err != nil {
		r.fail("rocket publisher: %v", err)
		return
	}
	defer pub.Close()
	sub, err := rocket.NewSubscriber(cfg)
	if err != nil {
		r.fail("rocket subscriber: %v", err)
		return
	}
	defer sub.Close()
	sctx, cancel := context.WithTimeout(ctx, probe+30*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(sctx, doctorTopic)
	if err != nil {
		r.fail("rocket subscribe %s: %v", doctorTopic, err)
		return
	}
	key := "doctor-precision-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	sent := time.Now()
	// With the timer wheel the publisher asks the broker for one precision
	// before due (rocket.PlanHop; the consumer runtime holds the message
	// until due): due a precision after the probe, the broker is asked for
	// the probe itself, whatever the precision.
	timer := len(cfg.Limits.Levels) == 0
	asked := sent.Add(probe)
	due := broker.MillisUTC(asked)
	if timer {
		due = broker.MillisUTC(asked.Add(cfg.Limits.Precision))
	}
	if err := pub.Publish(sctx, &broker.Message{Topic: doctorTopic, Key: key, DeliverAt: due, Payload: []byte("doctor")}); err != nil {
		r.fail("precision probe not sent: %v", err)
		return
	}
	for {
		select {
		case d, ok := <-ch:
			if !ok {
				r.fail("precision probe never arrived within %v", probe+30*time.Second)
				return
			}
			_ = d.Acker.Ack()
			if d.Message == nil || d.Message.Key != key {
				continue // an earlier probe
			}
			got := time.Now()
			switch off := got.Sub(asked); {
			case timer && got.Sub(sent) < probe/2:
				r.fail("a %v timer probe arrived after %v: timer messages are off (timerWheelEnable=true)", probe, got.Sub(sent).Round(time.Millisecond))
			case off < -cfg.Limits.Precision:
				r.warn("the %v probe arrived %v before the time the broker was asked for (the consumer runtime holds such messages; precision worse than --rocketmq-precision %v)", probe, -off, cfg.Limits.Precision)
			default:
				r.ok("a %v probe arrived %v after the time the broker was asked for, %v from due (configured precision %v)", probe, off.Round(time.Millisecond), got.Sub(due).Round(time.Millisecond), cfg.Limits.Precision)
			}
			return
		case <-sctx.Done():
			r.fail("precision probe never arrived within %v", probe+30*time.Second)
			return
		}
	}
}

// checkRocketLimits reads the brokers' delay settings through the admin
// API, reports them, and resolves the configured limits against them as
// run does: unset ones become the brokers', ones they cannot keep fail. On
// success cfg holds the resolved limits, trusted from then on.
func checkRocketLimits(ctx context.Context, bf *brokerFlags, cfg *rocket.Config, r *report) bool {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	live, err := rocket.ReadBrokerLimits(cctx, *cfg)
	if err != nil {
		r.fail("RocketMQ at %s: cannot read the brokers' delay settings: %v", bf.RocketNameServers, scrub(err, bf.RocketSecretKey))
		return false
	}
	names := make([]string, 0, len(live.Brokers))
	for name, addr := range live.Brokers {
		names = append(names, name+" "+addr)
	}
	slices.Sort(names)
	r.ok("RocketMQ brokers %s: timerWheelEnable=%v, timerMaxDelaySec %v, timerPrecisionMs %v, messageDelayLevel %v",
		strings.Join(names, ", "), live.TimerWheel, live.TimerMaxDelay, live.TimerPrecision, live.Levels)
	for name, why := range live.Unanswered {
		r.warn("RocketMQ broker %s did not answer (its limits are assumed to be the others'): %v", name, why)
	}
	resolved, err := live.Resolve(cfg.Limits)
	if err != nil {
		r.fail("%v", err)
		return false
	}
	if len(resolved.Levels) > 0 {
		r.ok("delay levels: %v, the brokers' own", resolved.Levels)
	} else {
		r.ok("timer limits: max hop %v (--rocketmq-max-delay %v), precision %v (--rocketmq-precision %v); 0 means the brokers'", resolved.MaxHop, bf.RocketMaxDelay, resolved.Precision, bf.RocketPrecision)
	}
	cfg.Limits, cfg.TrustLimits = resolved, true
	return true
}
