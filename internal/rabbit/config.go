package rabbit

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/redacturl"
)

// Mode chooses how the adapter delays messages.
type Mode int

const (
	// ModeLadder, the default, delays messages in a binary ladder of quorum
	// queues, each with one queue-wide TTL, chained by at-least-once
	// dead-lettering. It needs no plugin and RabbitMQ 3.10 or later.
	ModeLadder Mode = iota
	// ModeDelayedExchange publishes to an x-delayed-message exchange with an
	// x-delay header. It needs the rabbitmq_delayed_message_exchange plugin,
	// which keeps delayed messages on one node, unreplicated.
	ModeDelayedExchange
)

func (m Mode) String() string {
	switch m {
	case ModeLadder:
		return "ladder"
	case ModeDelayedExchange:
		return "delayed-exchange"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// DeadLettering is how each ladder level moves an expired message on to
// the next (RabbitMQ's x-dead-letter-strategy). Every process of one
// deployment must use the same: it is an argument of the ladder's queues,
// and RabbitMQ refuses to declare a queue again with another, so changing it
// needs the ladder's queues deleted first.
type DeadLettering int

const (
	// AtLeastOnce, the default, moves a message through a dead-letter
	// worker that keeps it in its level until the next queue confirmed it,
	// so a full queue holds the message back instead of dropping it. On
	// RabbitMQ before 3.12.5 a worker that starts after a node died, before
	// its target queue (led by that node) elected a new leader, never
	// reaches that queue again until the node returns: after a node of a
	// cluster is lost, the hops between queues it led stall and the
	// scanner publishes their tasks again after its grace
	// (docs/deployment.md).
	AtLeastOnce DeadLettering = iota
	// AtMostOnce lets each level's leader publish the expired message
	// itself, unconfirmed: after a node is lost delivery resumes as soon as
	// the new leaders are elected (BENCHMARKS.md, "RabbitMQ adapter"). A
	// message that expires into a queue whose leader is being elected, or
	// into a full one, is dropped; its task is still published in the
	// outbox, so the scanner publishes it again after its grace: late,
	// never lost. For a RabbitMQ cluster before 3.12.5.
	AtMostOnce
)

// String returns the x-dead-letter-strategy value.
func (d DeadLettering) String() string {
	switch d {
	case AtLeastOnce:
		return "at-least-once"
	case AtMostOnce:
		return "at-most-once"
	}
	return fmt.Sprintf("DeadLettering(%d)", int(d))
}

// ParseDeadLettering reads "at-least-once" or "at-most-once".
func ParseDeadLettering(s string) (DeadLettering, error) {
	for _, d := range []DeadLettering{AtLeastOnce, AtMostOnce} {
		if s == d.String() {
			return d, nil
		}
	}
	return 0, fmt.Errorf("rabbit: dead-lettering %q: want at-least-once or at-most-once", s)
}

// Defaults applied to zero Config fields.
const (
	// DefaultPrefix starts the name of every exchange and queue.
	DefaultPrefix = "delaybridge"
	// DefaultUnit is the ladder's smallest step. It is short so the part of a
	// delay below one unit, which the consumer runtime waits out in memory
	// while the delivery counts against the prefetch, stays short too.
	DefaultUnit = 100 * time.Millisecond
	// DefaultDepth is the number of ladder levels. With DefaultUnit the top
	// level's TTL is 2^25 × 100ms ≈ 38.8 days, under MaxLevelTTL, and one hop
	// covers (2^26 − 1) × 100ms ≈ 77 days 16 hours; longer delays hop.
	DefaultDepth = 26
	// DefaultLead is how much earlier than asked the ladder releases a
	// message; the consumer runtime holds it until due. A delay shorter
	// than the lead skips the ladder: with the relay's default lookahead,
	// which equals it, the relay's messages go straight to their topic's
	// queue and never pay a dead-letter hop. Hops are what RabbitMQ does
	// worst: at a high due rate, tasks that hop arrive late and tasks that
	// skip the ladder arrive on time. Ten seconds lets the relay publish a
	// spike of tasks before it comes due instead of while it is handled.
	// A longer lead costs consumer memory (DefaultPrefetch). The figures
	// are in BENCHMARKS.md, "Choosing the lookahead, the lead and what is
	// in flight".
	DefaultLead = 10 * time.Second
	// DefaultMaxLength is the x-max-length guard on each ladder queue.
	DefaultMaxLength = 5_000_000
	// DefaultConfirmWindow is how many publishes may await their confirm.
	DefaultConfirmWindow = 1000
	// DefaultChannels is how many connections, each with one confirm
	// channel, a Publisher spreads its calls over. RabbitMQ handles each
	// channel in its own process, so two let it parse and route in parallel.
	DefaultChannels = 2
	// DefaultPrefetch is the unacked deliveries one subscription may hold.
	// Early messages the runtime holds count against it, so it bounds the
	// due rate one subscription sustains at Prefetch / (Unit + Lead): with
	// the defaults about 5.9k tasks/s. The messages held cost the consumer
	// about their size in memory (BENCHMARKS.md, "Choosing the lookahead,
	// the lead and what is in flight").
	DefaultPrefetch = 60000
	// MaxPrefetch is the largest Prefetch: AMQP's prefetch count is 16 bits.
	MaxPrefetch = 65535
	// DefaultConnectionName names the connections in the management UI and
	// in rabbitmqctl list_connections.
	DefaultConnectionName = "delaybridge"
	// DefaultDialTimeout bounds one connection attempt.
	DefaultDialTimeout = 5 * time.Second
	// DefaultHeartbeat is the AMQP heartbeat interval.
	DefaultHeartbeat = 10 * time.Second
	// DefaultReconnectMax is the longest pause between reconnect attempts.
	DefaultReconnectMax = 5 * time.Second
)

// MaxLevelTTL is the longest queue TTL the ladder uses for one level, the
// largest value RabbitMQ documents for x-message-ttl (2^32 − 1 ms).
const MaxLevelTTL = math.MaxUint32 * time.Millisecond

// MaxDelayedExchangeHop is the longest x-delay the delayed-message plugin
// accepts (2^32 − 1 ms); longer delays hop.
const MaxDelayedExchangeHop = math.MaxUint32 * time.Millisecond

// LadderLookahead and DelayedExchangeLookahead are the relay's default
// lookahead on RabbitMQ (broker.Limits.Lookahead). RabbitMQ 3.10 quorum
// queues keep every waiting message in memory and every
// ladder level a message passes costs a dead-letter hop, so the broker
// holds only the next seconds: the ladder's lookahead is its lead
// (DefaultLead unless set), or its unit where that is longer, so what the
// relay publishes skips the ladder and waits in the consumer.
// LadderLookahead is that lookahead with the default lead and unit. The plugin's exchange keeps its messages on
// one node only, so its five seconds limit what a lost node takes with
// it, and still let the relay publish a burst of tens of thousands of
// tasks due at one instant before it.
const (
	LadderLookahead          = DefaultLead
	DelayedExchangeLookahead = 5 * time.Second
)

// delayedPrecision is how far from x-delay the plugin may deliver.
const delayedPrecision = 10 * time.Millisecond

// Config configures a Publisher or a Subscriber. The two must agree on URL's
// broker, Prefix, Mode, Unit, Depth, MaxLength and DeadLettering: those shape the topology
// both declare. Zero values mean the defaults above.
type Config struct {
	// URL is the AMQP URL, such as amqp://user:pass@host:5672/vhost, or
	// amqps://… for TLS. Required.
	URL string
	// Nodes lists the other nodes of URL's cluster as host:port; URL's
	// scheme, user, password, vhost and query apply to each. A connection
	// goes to the first node that answers, and every reconnect starts at the
	// node after the last one reached, so a client whose node died moves on
	// to the next. Default none: URL's node only.
	Nodes []string
	// TLS configures the TLS of an amqps:// URL: the CA that verifies the
	// server and the client certificate, if any. Nil means what the URL's
	// query says (amqp091-go reads cacertfile, certfile, keyfile and
	// server_name_indication) or, without those, the system roots. Setting
	// it with an amqp:// URL is an error, so TLS is never silently off.
	// Each connection uses its own copy.
	TLS *tls.Config
	// Prefix starts every exchange and queue name. Default DefaultPrefix.
	Prefix string
	// Mode chooses the ladder (default) or the delayed-message exchange.
	Mode Mode
	// Unit is the ladder's smallest step, a whole number of milliseconds.
	// A hop's delay is rounded down to whole units, never up, so no message
	// is late by the rounding; the consumer runtime holds the remainder.
	// Default DefaultUnit.
	Unit time.Duration
	// Depth is the number of ladder levels. Level k holds messages for
	// Unit × 2^k, so one hop covers at most Unit × (2^Depth − 1); Unit ×
	// 2^(Depth−1) must not exceed MaxLevelTTL. Default DefaultDepth.
	Depth int
	// Lead is subtracted from every ladder delay before it is rounded down
	// to units, so messages arrive up to Unit + Lead early and are held by
	// the consumer runtime until due; Limits().Precision is Unit + Lead.
	// Negative means none. Default DefaultLead, or half of one hop when the
	// ladder is shorter than twice that.
	Lead time.Duration
	// MaxLength is the x-max-length of each ladder queue and each topic's
	// queue; with x-overflow=reject-publish a publish into a full queue is
	// nacked and Publish reports that message failed (the relay retries it
	// later), and a full topic queue holds back the ladder's last level.
	// The levels are shared by every topic: the messages of a topic whose
	// queue is full wait in the levels and count against their bound, so a
	// topic whose consumers stay down until its queue fills can then fill
	// a level, and every topic's publishes through that level are nacked
	// (and retried) until it drains. Alert on a topic queue's depth well
	// below the bound.
	// Negative means no guard. Default DefaultMaxLength. Changing it needs
	// the queues deleted first (RabbitMQ refuses to redeclare a queue with
	// other arguments).
	MaxLength int
	// DeadLettering is how the ladder's levels hand an expired message
	// on: AtLeastOnce (the default) or AtMostOnce, for a cluster on
	// RabbitMQ before 3.12.5 (see DeadLettering). Ladder mode only.
	DeadLettering DeadLettering
	// ConfirmWindow bounds the publishes awaiting a confirm on each
	// channel. Default DefaultConfirmWindow.
	ConfirmWindow int
	// Channels is how many connections, each with one confirm channel and
	// one owner goroutine, a Publisher uses; one Publish call goes through
	// one of them. Default DefaultChannels.
	Channels int
	// Prefetch is the consumer prefetch of each subscription. Early
	// messages the runtime holds count against it, so it should exceed the
	// due rate × (Unit + Lead). Default DefaultPrefetch; at most
	// MaxPrefetch.
	Prefetch int
	// ConnectionName is sent as the connection_name client property,
	// followed by the role (" publisher", " subscriber <topic>"). Default
	// DefaultConnectionName.
	ConnectionName string
	// DialTimeout bounds one connection attempt. Default DefaultDialTimeout.
	DialTimeout time.Duration
	// Heartbeat is the AMQP heartbeat. Default DefaultHeartbeat.
	Heartbeat time.Duration
	// ReconnectMax is the longest pause between reconnect attempts, which
	// back off exponentially from 100ms. Default DefaultReconnectMax.
	ReconnectMax time.Duration
	// Logger receives the adapter's logs. Default slog.Default().
	Logger *slog.Logger

	// The package's tests set these to run delayed-exchange mode's hops on
	// the real plugin in seconds and to meet a broker without the exchange
	// type; zero means MaxDelayedExchangeHop and the plugin's type.
	delayedMaxHop time.Duration
	delayedType   string
	// ring is URL and Nodes in dial order, made by withDefaults and shared
	// by the copies of one client's Config.
	ring *nodeRing
}

func (c Config) withDefaults() (Config, error) {
	if c.URL == "" {
		return c, errors.New("rabbit: Config.URL is required")
	}
	if err := checkURL(c.URL); err != nil {
		return c, err
	}
	if c.TLS != nil && !strings.HasPrefix(strings.ToLower(c.URL), "amqps://") {
		return c, errors.New("rabbit: Config.TLS needs an amqps:// URL")
	}
	if c.ring == nil {
		ring, err := newNodeRing(c.URL, c.Nodes)
		if err != nil {
			return c, err
		}
		c.ring = ring
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if err := validName(c.Prefix); err != nil {
		return c, fmt.Errorf("rabbit: Config.Prefix: %w", err)
	}
	if c.Unit == 0 {
		c.Unit = DefaultUnit
	}
	if c.Depth == 0 {
		c.Depth = DefaultDepth
	}
	if c.Mode == ModeLadder {
		// Before the lead's default, which is worked out from them.
		if c.Unit < time.Millisecond || c.Unit%time.Millisecond != 0 {
			return c, fmt.Errorf("rabbit: Config.Unit %v must be a whole number of milliseconds", c.Unit)
		}
		if c.Depth < 1 || c.Depth > 62 {
			return c, fmt.Errorf("rabbit: Config.Depth %d must be between 1 and 62", c.Depth)
		}
	}
	if c.Lead == 0 {
		// At most half of one hop, so a short ladder (a test's) still
		// makes progress with the default.
		c.Lead = DefaultLead
		if hop := LadderMaxHop(c.Unit, c.Depth); hop > 0 {
			c.Lead = min(DefaultLead, (hop / 2).Truncate(time.Millisecond))
		}
	}
	if c.Lead < 0 {
		c.Lead = -1
	}
	if c.MaxLength == 0 {
		c.MaxLength = DefaultMaxLength
	}
	if c.ConfirmWindow <= 0 {
		c.ConfirmWindow = DefaultConfirmWindow
	}
	if c.Channels <= 0 {
		c.Channels = DefaultChannels
	}
	if c.Prefetch <= 0 {
		c.Prefetch = DefaultPrefetch
	}
	if c.Prefetch > MaxPrefetch {
		// basic.qos carries the count in 16 bits: the client would send
		// 65536 as 0, no limit at all, and 100000 as 34464.
		return c, fmt.Errorf("rabbit: Config.Prefetch %d is above %d, the most AMQP's basic.qos can carry; for a higher due rate run more consumer processes, or lower Unit or Lead", c.Prefetch, MaxPrefetch)
	}
	if c.ConnectionName == "" {
		c.ConnectionName = DefaultConnectionName
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.ReconnectMax <= 0 {
		c.ReconnectMax = DefaultReconnectMax
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch c.Mode {
	case ModeLadder:
		if top := c.Unit << (c.Depth - 1); top > MaxLevelTTL || top>>(c.Depth-1) != c.Unit {
			return c, fmt.Errorf("rabbit: Config.Unit %v with Depth %d makes the top level's TTL exceed %v; lower Depth", c.Unit, c.Depth, MaxLevelTTL)
		}
		// A hop of the longest delay, less the lead, must still spend at
		// least one unit in the ladder; otherwise it comes straight back,
		// just as early, and is hopped again without end.
		if hop := LadderMaxHop(c.Unit, c.Depth); hop-max(c.Lead, 0) < c.Unit {
			return c, fmt.Errorf("rabbit: Config.Depth %d with Unit %v gives a longest hop of %v, which the %v Lead leaves under one unit: no hop could make progress; raise Depth or lower Lead",
				c.Depth, c.Unit, hop, max(c.Lead, 0))
		}
		if c.DeadLettering != AtLeastOnce && c.DeadLettering != AtMostOnce {
			return c, fmt.Errorf("rabbit: unknown Config.DeadLettering %d: want AtLeastOnce or AtMostOnce", int(c.DeadLettering))
		}
	case ModeDelayedExchange:
	default:
		return c, fmt.Errorf("rabbit: unknown Config.Mode %d", int(c.Mode))
	}
	return c, nil
}

// Limits returns the limits a Publisher of c would report, with c's
// defaults applied (the lead clamped to half a short ladder's hop), or the
// error NewPublisher would give for c, without connecting.
func (c Config) Limits() (broker.Limits, error) {
	c, err := c.withDefaults()
	if err != nil {
		return broker.Limits{}, err
	}
	return c.limits(), nil
}

// limits returns what one hop may do in the configured mode.
func (c Config) limits() broker.Limits {
	if c.Mode == ModeDelayedExchange {
		return broker.Limits{MaxHop: c.delayedHop(), Precision: delayedPrecision, Lookahead: DelayedExchangeLookahead}
	}
	return broker.Limits{MaxHop: LadderMaxHop(c.Unit, c.Depth), Precision: c.Unit + max(c.Lead, 0), Lookahead: max(c.Lead, c.Unit)}
}

// LadderMaxHop returns the longest delay one hop of a ladder with this unit
// and depth covers: unit × (2^depth − 1); 0 for a depth no ladder may have
// (outside 1 to 62).
func LadderMaxHop(unit time.Duration, depth int) time.Duration {
	if depth < 1 || depth > 62 {
		return 0
	}
	return unit * time.Duration(uint64(1)<<depth-1)
}

// validName accepts the characters a prefix may use in exchange and queue
// names without clashing with the '.' separator the ladder's routing keys use.
func validName(s string) error {
	if len(s) > 100 {
		return fmt.Errorf("%q is longer than 100 characters", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("%q has %q; use [A-Za-z0-9_.-]", s, c)
		}
	}
	return nil
}

// RedactURL returns raw with the password in its user information replaced
// by "xxxxx", for logs and errors, even when raw does not parse: everything
// between "://" and the last '@' counts as user information.
func RedactURL(raw string) string { return redacturl.Hide(raw) }

// checkURL reports why raw is not an AMQP URL amqp091-go can dial. Its
// error shows the URL only as RedactURL does: the errors of net/url quote
// the URL or a piece of it (a port that is really the start of a password
// holding '/'), so they are described here rather than wrapped.
func checkURL(raw string) error {
	_, err := amqp.ParseURI(raw)
	if err == nil {
		return nil
	}
	var (
		urlErr *url.Error
		numErr *strconv.NumError
	)
	switch {
	case strings.ContainsFunc(raw, unicode.IsControl):
		err = errors.New("it holds a control character (a tab or a line break?)")
	case errors.As(err, &urlErr):
		// Classified, not quoted: net/url's message may hold a piece of
		// the password.
		var hostErr url.InvalidHostError
		msg := urlErr.Err.Error()
		switch {
		case strings.HasPrefix(msg, "invalid port"):
			err = errors.New("its port is not a number (or a '/' or ':' in the password is not percent-encoded)")
		case errors.As(urlErr.Err, &hostErr) || strings.Contains(msg, "in host") || strings.Contains(msg, "missing ']'"):
			err = errors.New("its host is not valid (an IPv6 address goes in brackets: amqp://user:pass@[::1]:5672/), or a reserved character in the password is not percent-encoded")
		default:
			err = errors.New(`it does not parse: percent-encode any reserved character ("?", "#", "@", ":", "/") in the user name and password`)
		}
	case errors.As(err, &numErr):
		err = errors.New("its port is not a number (is a '/' or ':' in the password not percent-encoded?)")
	}
	// What remains are amqp091-go's fixed messages (wrong scheme, a
	// space), which quote nothing.
	return fmt.Errorf("rabbit: Config.URL %q is not a valid AMQP URL: %w", RedactURL(raw), err)
}
