package main

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/outbox"
	"github.com/delaybridge/delaybridge/rabbit"
	"github.com/delaybridge/delaybridge/rocket"
)

// doctorTopic is where doctor's probes travel.
const doctorTopic = "delaybridge-doctor"

// report collects doctor's findings: printed to a.stdout as they come,
// and kept in checks for the console's brokers page.
type report struct {
	a      *app
	failed int
	warned int
	// scope starts every line: "shard NAME: " while a shard is checked.
	scope  string
	checks []doctorCheck
}

// doctorCheck is one finding: OK, WARN or FAIL and what it says.
type doctorCheck struct {
	Level string
	Text  string
}

func (r *report) add(level, format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	text = r.scope + text
	r.checks = append(r.checks, doctorCheck{Level: level, Text: text})
	fmt.Fprintf(r.a.stdout, "%-6s%s\n", level, text)
}

func (r *report) ok(format string, args ...any) { r.add("OK", format, args...) }

func (r *report) warn(format string, args ...any) {
	r.warned++
	r.add("WARN", format, args...)
}

func (r *report) fail(format string, args ...any) {
	r.failed++
	r.add("FAIL", format, args...)
}

func newDoctorCmd(a *app) *cobra.Command {
	var bf brokerFlags
	var sf shardFlags
	var probe time.Duration
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the database and the broker against delaybridge's configuration",
		Long: `doctor checks, in plain words, what delaybridge needs from the live services:
the database version supports SKIP LOCKED, the outbox schema is migrated, and
its clock agrees with this host; for RabbitMQ, the server version, quorum
queues with at-least-once dead-lettering, whether the delayed-message plugin
is present (and, in delayed-exchange mode, what it does not promise), and
whether the ladder topology of --rabbit-prefix is in place
with the configured depth; for RocketMQ, the brokers' timerWheelEnable,
timerMaxDelaySec, timerPrecisionMs and messageDelayLevel (read through the admin
API, as run reads them) against --rocketmq-max-delay, --rocketmq-precision and
--rocketmq-levels, that the broker accepts a hop of the max hop and refuses one
just past it
(probes that stay in the broker's timer store until then, on the topic
delaybridge-doctor), and the measured delivery precision of a short probe.
With --shard NAME=DSN (repeated), the database checks run on every outbox
shard, each line naming its shard. Every line starts with OK, WARN or FAIL;
the exit code is 1 when any check failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Checked before any check runs: a bad delay creates no probe
			// topic and publishes no probe.
			if err := cli.CheckProbeDelay(probe); err != nil {
				return err
			}
			r := runDoctor(cmd.Context(), a, &bf, &sf, probe)
			fmt.Fprintf(a.stdout, "%d failed, %d warnings\n", r.failed, r.warned)
			if r.failed > 0 {
				return fmt.Errorf("doctor: %d check(s) failed", r.failed)
			}
			return nil
		},
	}
	bf.register(cmd.Flags())
	sf.register(cmd.Flags())
	cmd.Flags().DurationVar(&probe, "probe-delay", 2*time.Second, "delay of the precision probe (more than 0)")
	return cmd
}

// runDoctor runs every check of the database and the broker bf names.
func runDoctor(ctx context.Context, a *app, bf *brokerFlags, sf *shardFlags, probe time.Duration) *report {
	r := &report{a: a}
	for _, w := range bf.warnings() {
		r.warn("%s", w)
	}
	checkSigningKeys(bf, r)
	if err := a.eachShard(ctx, sf, func(ctx context.Context, name string) error {
		if name != "" {
			r.scope = "shard " + name + ": "
		}
		checkDatabase(ctx, a, r)
		r.scope = ""
		return nil
	}); err != nil {
		r.fail("%v", err)
	}
	switch bf.Broker {
	case "rabbit":
		checkRabbit(ctx, a, bf, r)
	case "rocket":
		checkRocket(ctx, a, bf, r, probe)
	default:
		r.fail("--broker %q: want rabbit or rocket", bf.Broker)
	}
	return r
}

// checkSigningKeys parses --signing-keys as run does (Config.Keyring), so
// keys run refuses fail here with run's words. Neither says a secret.
func checkSigningKeys(bf *brokerFlags, r *report) {
	ring, err := bf.Keyring()
	switch {
	case err != nil:
		r.fail("%v", err)
	case ring != nil:
		r.ok("--signing-keys: %d key(s), %q signs", len(ring), ring[0].ID)
	}
}

func checkDatabase(ctx context.Context, a *app, r *report) {
	db, err := a.openDB(ctx)
	if err != nil {
		r.fail("database: %v", err)
		return
	}
	defer db.Close()
	d, err := outbox.InspectDatabase(ctx, db)
	if err != nil {
		r.fail("database: %v", err)
		return
	}
	checkDatabaseTransport(ctx, a, db, r)
	unsafe := d.Check()
	if unsafe != nil {
		r.fail("database: %v", unsafe)
	}
	var applied sql.NullInt64
	migs, merr := outbox.Migrations()
	switch err := db.QueryRowContext(ctx, "SELECT MAX(version) FROM delaybridge_migration").Scan(&applied); {
	case err != nil || !applied.Valid:
		r.fail("outbox schema not migrated: run delaybridge migrate")
	case merr != nil:
		r.fail("embedded migrations: %v", merr)
	case applied.Int64 < int64(migs[len(migs)-1].Version):
		r.fail("outbox schema at version %d, this binary needs %d: run delaybridge migrate", applied.Int64, migs[len(migs)-1].Version)
	default:
		r.ok("outbox schema at version %d", applied.Int64)
		defer checkProcesses(ctx, db, r)
		if unsafe != nil {
			break
		}
		if err := outbox.ProbeSkipLocked(ctx, db); err != nil {
			r.fail("database %s: %v", d, err)
		} else {
			r.ok("database %s: FOR UPDATE SKIP LOCKED skips a row another connection holds (probed)%s", d, binlogNote(d))
		}
	}
	before := time.Now()
	var dbMS int64
	if err := db.QueryRowContext(ctx, "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)").Scan(&dbMS); err == nil {
		after := time.Now()
		mid := before.Add(after.Sub(before) / 2)
		skew := time.UnixMilli(dbMS).Sub(mid)
		if skew.Abs() > time.Second {
			r.warn("database clock differs from this host by %v (only delaybridge's own clocks decide due times, but logs will disagree)", skew.Round(time.Millisecond))
		} else {
			r.ok("database clock within %v of this host", skew.Abs().Round(time.Millisecond)+time.Millisecond)
		}
	}
}

// checkProcesses reports what the live presences of relays and consumers
// say: broker topologies that differ fail (the tasks of one sit in queues
// the other never reads; a consumer refuses to start so, a relay only
// logs it), and pending tasks past due warn, more loudly with no live
// relay.
func checkProcesses(ctx context.Context, db *sql.DB, r *report) {
	st, err := outbox.ReadStats(ctx, db, time.Now(), doctorGrace, 0)
	if err != nil {
		r.warn("live processes: %v", err)
		return
	}
	p, err := readProcesses(ctx, db, st)
	if err != nil {
		r.warn("live processes: %v", err)
		return
	}
	for _, m := range p.Mismatches {
		r.fail("broker topology differs between live processes: %s: tasks may sit in queues nobody reads", cli.Printable(m))
	}
	if len(p.Mismatches) == 0 {
		r.ok("live processes: %d relay(s) and %d consumer(s), no broker topology differs between them", p.LiveRelays, p.LiveConsumers)
	}
	switch {
	case p.NoRelay:
		r.warn("%d pending tasks more than %v past due and no live relay: start `delaybridge run`", p.OverduePending, doctorGrace)
	case p.OverduePending > 0:
		r.warn("%d pending tasks more than %v past due though %d relay(s) are live: the relay's publishes fail or it is behind (see its log)", p.OverduePending, doctorGrace, p.LiveRelays)
	}
}

// doctorGrace is how far past due a pending task must be for doctor to
// warn of it: status's default --grace.
const doctorGrace = 30 * time.Second

// checkDatabaseTransport says whether the outbox connection is encrypted,
// and warns when it is not and leaves this host, or when it is encrypted
// without verifying the server (tls=skip-verify or tls=preferred in the
// DSN), which an active man in the middle defeats.
func checkDatabaseTransport(ctx context.Context, a *app, db *sql.DB, r *report) {
	var name, cipher string
	if err := db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher); err != nil {
		r.warn("database: cannot tell whether the connection is encrypted: %v", err)
		return
	}
	cfg, err := a.mysqlConfig()
	if err != nil {
		return
	}
	switch {
	case cipher != "" && cfg.TLS != nil && cfg.TLS.InsecureSkipVerify:
		r.warn("database connection uses TLS (cipher %s) but does not verify the server's certificate (tls=%s in the DSN): use --mysql-tls-ca or tls=true (see SECURITY.md)", cipher, cfg.TLSConfig)
	case cipher != "":
		r.ok("database connection uses TLS (cipher %s)", cipher)
	case cfg.Net == "unix":
	default:
		if host, _, err := net.SplitHostPort(cfg.Addr); err == nil && !isLoopback(host) {
			r.warn("database connection to %s is not encrypted: set --mysql-tls-ca or tls=true in the DSN (see SECURITY.md)", cfg.Addr)
		}
	}
}

// isLoopback reports whether host names this machine.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// binlogNote says what doctor found about the binary log.
func binlogNote(d outbox.Database) string {
	if !d.BinlogOn {
		return "; binary log off"
	}
	return "; binary log format " + d.BinlogFormat
}

func checkRabbit(ctx context.Context, a *app, bf *brokerFlags, r *report) {
	cfg, err := bf.rabbitConfig(a)
	if err != nil {
		r.fail("rabbit: %v", err)
		return
	}
	// Settings the adapter refuses (a malformed URL) are not an unreachable
	// broker: say so as run would.
	if _, err := cfg.Limits(); err != nil {
		r.fail("RabbitMQ settings: %v", scrub(err, bf.AMQPURL))
		return
	}
	in, err := rabbit.Inspect(ctx, cfg)
	if err != nil {
		r.fail("RabbitMQ at %s unreachable: %v", rabbit.RedactURL(bf.AMQPURL), scrub(err, bf.AMQPURL))
		return
	}
	if in.TLS != 0 {
		r.ok("RabbitMQ connection uses %s", tls.VersionName(in.TLS))
	} else if u, err := url.Parse(bf.AMQPURL); err == nil && !isLoopback(u.Hostname()) {
		r.warn("RabbitMQ connection to %s is not encrypted: use an amqps:// URL (see SECURITY.md)", u.Host)
	}
	version := in.Version
	if major, minor := versionOf(version); major > 3 || (major == 3 && minor >= 10) {
		r.ok("RabbitMQ %s (3.10+ has at-least-once dead-lettering)", version)
	} else {
		r.fail("RabbitMQ %s is older than 3.10: the ladder needs quorum queues with at-least-once dead-lettering", version)
	}
	if w := clusterDeadLetteringWarning(version, len(bf.AMQPNodes), bf.RabbitMode, cfg.DeadLettering); w != "" {
		r.warn("%s", w)
	}
	if w := deliveryLimitWarning(version, cfg.Prefix); w != "" {
		r.warn("%s", w)
	}
	if err := in.QuorumDeadLettering; err != nil {
		r.fail("cannot declare a quorum queue with at-least-once dead-lettering: %v (enable the quorum_queue feature flag)", err)
	} else {
		r.ok("quorum queues with at-least-once dead-lettering work")
	}
	checkRabbitPlugin(ctx, bf, cfg, r)
	if cfg.Mode != rabbit.ModeLadder {
		return
	}
	switch depth := in.Depth; {
	case in.LevelsMissing == depth:
		r.warn("no ladder under prefix %q yet: the first publisher declares it", cfg.Prefix)
	case in.LevelsMissing > 0:
		r.fail("ladder under prefix %q is incomplete: %d of %d level queues missing", cfg.Prefix, in.LevelsMissing, depth)
	case in.ExtraLevel:
		r.fail("ladder under prefix %q is deeper than --rabbit-depth %d: was it declared with other settings?", cfg.Prefix, depth)
	default:
		r.ok("ladder under prefix %q has its %d levels: one hop covers %v", cfg.Prefix, depth, rabbit.LadderMaxHop(bf.RabbitUnit, depth))
	}
	r.ok("clock skew with RabbitMQ: not measurable over AMQP (the ladder's TTLs use the broker's clock only for durations)")
}

// clusterDeadLetteringWarning says when a ladder on a RabbitMQ cluster will
// stall after losing a node: before 3.12.5 a level's dead-letter worker
// that reaches its target queue before it elected a new leader keeps
// asking the dead node (docs/deployment.md), and at-least-once
// dead-lettering then holds those hops until the node returns. Empty when
// it does not apply: one node, delayed-exchange mode, at-most-once, or a
// fixed version.
func clusterDeadLetteringWarning(version string, otherNodes int, mode string, dl rabbit.DeadLettering) string {
	if otherNodes == 0 || mode != "ladder" || dl != rabbit.AtLeastOnce {
		return ""
	}
	major, minor := versionOf(version)
	patch := 0
	if parts := strings.SplitN(version, ".", 3); len(parts) == 3 {
		digits := strings.TrimRightFunc(parts[2], func(r rune) bool { return r < '0' || r > '9' })
		patch, _ = strconv.Atoi(digits)
	}
	if major > 3 || major == 3 && (minor > 12 || minor == 12 && patch >= 5) {
		return ""
	}
	return fmt.Sprintf("RabbitMQ %s cluster with at-least-once dead-lettering: after a node is lost, ladder hops can stall until it returns (a RabbitMQ bug fixed in 3.12.5), so those tasks wait for the scanner's --grace; upgrade RabbitMQ or set --rabbit-dead-lettering at-most-once on every process (docs/deployment.md)", version)
}

// deliveryLimitWarning says when the broker's quorum queues have a
// delivery limit of their own (RabbitMQ 4.0 and later: 20 by default): a
// message given back that many times is dropped (the topic queues have no
// dead-letter exchange), and the consumer gives messages back while it
// cannot settle them, through a database outage for one. The scanner
// publishes the task again after its grace, so it is late, not lost; a
// message with no task (foreign, malformed) is lost without a dead record.
// The broker's policies are out of AMQP's sight, so doctor cannot tell
// whether one already raised the limit.
func deliveryLimitWarning(version, prefix string) string {
	if major, _ := versionOf(version); major < 4 {
		return ""
	}
	return fmt.Sprintf("RabbitMQ %s drops a quorum queue's message after 20 deliveries unless a policy raises delivery-limit: a consumer gives a message back every second while it cannot settle it (a retry it cannot publish, a dead letter it cannot record), and those tasks then come back only through the scanner's --grace; unless you did already, run rabbitmqctl set_policy delaybridge-delivery-limit '^%s\\.q\\.' '{\"delivery-limit\": 1000000}' --apply-to quorum_queues (docs/brokers.md)",
		version, regexp.QuoteMeta(prefix))
}

func versionOf(v string) (int, int) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0
	}
	a, _ := strconv.Atoi(parts[0])
	b, _ := strconv.Atoi(parts[1])
	return a, b
}

func checkRocket(ctx context.Context, a *app, bf *brokerFlags, r *report, probe time.Duration) {
	cfg, err := bf.rocketConfig(a)
	if err != nil {
		r.fail("rocket: %v", err)
		return
	}
	if !checkRocketLimits(ctx, bf, &cfg, r) {
		return
	}
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

// checkRabbitPlugin reports whether the delayed-message plugin is there and,
// in delayed-exchange mode, what it does not promise.
func checkRabbitPlugin(ctx context.Context, bf *brokerFlags, cfg rabbit.Config, r *report) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	present, err := rabbit.PluginPresent(cctx, cfg)
	delayed := bf.RabbitMode == "delayed-exchange"
	switch {
	case err != nil:
		r.fail("cannot tell whether the delayed-message plugin is present: %v", scrub(err, bf.AMQPURL))
		return
	case !present && delayed:
		r.fail("delayed-message plugin missing but --rabbit-mode delayed-exchange is set: enable rabbitmq_delayed_message_exchange or use --rabbit-mode ladder")
		return
	case !present:
		r.ok("delayed-message plugin absent (not needed in ladder mode)")
		return
	case !delayed:
		r.ok("delayed-message plugin present (delayed-exchange mode possible; ladder mode needs no plugin)")
		return
	}
	r.ok("delayed-message plugin present: delayed-exchange mode works; one hop is at most %v, longer delays hop", rabbit.MaxDelayedExchangeHop)
	r.warn("delayed-exchange mode: the plugin keeps waiting messages in a Mnesia table on one node, not replicated; a lost node loses them and the scanner publishes them again after --grace (the ladder's quorum queues are replicated)")
	r.warn("delayed-exchange mode: the plugin routes a message only when it is due, so publishing cannot ask for mandatory returns; a message whose topic queue is gone is dropped silently and only the scanner notices")
	r.warn("delayed-exchange mode: upstream calls the plugin unmaintained and meant for delays of a day or two, not for hundreds of thousands of waiting messages; the ladder (--rabbit-mode ladder) has none of these limits")
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
