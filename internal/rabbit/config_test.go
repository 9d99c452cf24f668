package rabbit

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A malformed URL must fail before any connection, with an error that shows
// neither the password nor any piece of it, whatever net/url would quote.
func TestNewPublisher_MalformedURLErrorHidesThePassword(t *testing.T) {
	const password = "S3CRETpw"
	for _, raw := range []string{
		"amqp://u:" + password + "@127.0.0.1:5672/\ttab",
		"amqp://u:" + password + "@127.0.0.1:5672/\nline",
		"amqp://u:" + password + "\"@127.0.0.1:5672/",
		"amqp://u:" + password + "\\@127.0.0.1:5672/\x7f",
		"amqp://u:S3/" + password + "@127.0.0.1:5672/",
		"amqp://u:" + password + "%zz@127.0.0.1:5672/",
		"amqp://u:" + password + "@127.0.0.1:99999999999/",
		"http://u:" + password + "@127.0.0.1/",
	} {
		_, err := NewPublisher(context.Background(), Config{URL: raw})
		if err == nil {
			t.Errorf("NewPublisher(%q) accepted the URL", raw)
			continue
		}
		msg := err.Error()
		for _, piece := range []string{password, password[2:], strconv.Quote(password)} {
			if strings.Contains(msg, piece) {
				t.Errorf("NewPublisher(%q): the error shows the password: %v", raw, err)
			}
		}
		if !strings.Contains(msg, "u:xxxxx@") || !strings.Contains(msg, "not a valid AMQP URL") {
			t.Errorf("NewPublisher(%q): the error does not name the redacted URL: %v", raw, err)
		}
	}
}

// The error says which part of a malformed URL to fix: a port that is not
// a number, a host that is not one, or a reserved character in the
// credentials.
func TestCheckURL_SaysWhichPartIsWrong(t *testing.T) {
	for _, c := range []struct{ raw, want string }{
		{"amqp://u:pw@127.0.0.1:notaport/", "port is not a number"},
		{"amqp://u:pw@[::1/", "host is not valid"},
		{"amqp://u:p%zz@127.0.0.1:5672/", "percent-encode"},
	} {
		err := checkURL(c.raw)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("checkURL(%q) = %v, want it to say %q", c.raw, err, c.want)
		}
	}
}

// A ladder whose longest hop, less the lead, is under one unit would
// deliver every hop at once and hop the message again without end.
func TestConfig_RefusesALadderWhoseHopsCannotMakeProgress(t *testing.T) {
	for _, c := range []struct {
		depth int
		lead  time.Duration
		ok    bool
	}{
		{1, 0, true},
		{1, 200 * time.Millisecond, false},
		{2, 200 * time.Millisecond, true},
		{2, 250 * time.Millisecond, false},
	} {
		cfg := Config{URL: "amqp://u:p@127.0.0.1:5672/", Unit: 100 * time.Millisecond, Depth: c.depth, Lead: c.lead}
		if c.lead == 0 {
			cfg.Lead = -1
		}
		_, err := cfg.withDefaults()
		if (err == nil) != c.ok {
			t.Errorf("depth %d, lead %v: err = %v, want ok %v", c.depth, c.lead, err, c.ok)
		}
		// The refusal says what to change.
		if err != nil && !strings.Contains(err.Error(), "no hop could make progress; raise Depth or lower Lead") {
			t.Errorf("depth %d, lead %v: err = %v, want it to say to raise Depth or lower Lead", c.depth, c.lead, err)
		}
	}
}

// A ladder depth or unit no ladder may have is an error naming it, from
// every entry point that reads the config without connecting, never a
// panic (a negative depth once reached a shift in the lead's default).
func TestConfig_RefusesADepthOrUnitOutOfRange(t *testing.T) {
	for _, c := range []struct {
		unit  time.Duration
		depth int
		want  string
	}{
		{0, -1, "Config.Depth -1"},
		{0, 63, "Config.Depth 63"},
		{0, 100, "Config.Depth 100"},
		{-time.Second, 0, "Config.Unit -1s"},
		{1500 * time.Microsecond, 0, "Config.Unit 1.5ms"},
	} {
		cfg := Config{URL: "amqp://u:p@127.0.0.1:5672/", Unit: c.unit, Depth: c.depth}
		if _, err := cfg.Limits(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("unit %v, depth %d: Limits err = %v, want one naming %q", c.unit, c.depth, err, c.want)
		}
		if _, err := cfg.Topology(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("unit %v, depth %d: Topology err = %v, want one naming %q", c.unit, c.depth, err, c.want)
		}
	}
	for _, depth := range []int{-1, 0, 63, 64} {
		if got := LadderMaxHop(time.Second, depth); got != 0 {
			t.Errorf("LadderMaxHop(1s, %d) = %v, want 0", depth, got)
		}
	}
}

// A prefetch above what AMQP's 16-bit count carries is refused: the client
// would send 65536 as 0 (no limit at all) and 100000 as 34464.
func TestConfig_RefusesAPrefetchAbove65535(t *testing.T) {
	for _, n := range []int{MaxPrefetch + 1, 100000} {
		cfg := Config{URL: "amqp://u:p@127.0.0.1:5672/", Prefetch: n}
		if _, err := NewSubscriber(cfg); err == nil || !strings.Contains(err.Error(), "Config.Prefetch") {
			t.Errorf("Prefetch %d: NewSubscriber err = %v, want one naming Config.Prefetch", n, err)
		}
	}
	if _, err := (Config{URL: "amqp://u:p@127.0.0.1:5672/", Prefetch: MaxPrefetch}).withDefaults(); err != nil {
		t.Errorf("Prefetch %d refused: %v", MaxPrefetch, err)
	}
}

// AtMostOnce is the ladder's way around the stall of RabbitMQ before
// 3.12.5 after a cluster node is lost (docs/deployment.md): every level
// queue is declared with it, and the default stays at-least-once.
func TestConfig_DeadLetteringSetsEveryLevelsStrategy(t *testing.T) {
	for _, c := range []struct {
		d    DeadLettering
		want string
	}{{AtLeastOnce, "at-least-once"}, {AtMostOnce, "at-most-once"}} {
		cfg, err := Config{URL: "amqp://u:p@127.0.0.1:5672/", Prefix: "p", Unit: time.Second, Depth: 3, DeadLettering: c.d}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		for k := range cfg.Depth {
			if got := (topology{cfg: cfg}).levelArgs(k)["x-dead-letter-strategy"]; got != c.want {
				t.Errorf("%v: level %d x-dead-letter-strategy %v, want %s", c.d, k, got, c.want)
			}
		}
		d, err := ParseDeadLettering(c.want)
		if err != nil || d != c.d {
			t.Errorf("ParseDeadLettering(%q) = %v, %v", c.want, d, err)
		}
		topo, err := cfg.Topology()
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := topo.Settings["dead-lettering"]; ok != (c.d != AtLeastOnce) || (ok && got != c.want) {
			t.Errorf("%v: Topology dead-lettering = %q (present %v)", c.d, got, ok)
		}
	}
	if _, err := ParseDeadLettering("exactly-once"); err == nil || !strings.Contains(err.Error(), "at-most-once") {
		t.Errorf("ParseDeadLettering(exactly-once) = %v, want an error naming the choices", err)
	}
	if _, err := (Config{URL: "amqp://u:p@127.0.0.1:5672/", DeadLettering: 7}).withDefaults(); err == nil || !strings.Contains(err.Error(), "DeadLettering") {
		t.Errorf("DeadLettering 7: err = %v, want it refused", err)
	}
}

// Config.Limits is what a Publisher of the config would report, without a
// connection: the default lead (and LadderLookahead, which equals it), a lead
// set, one clamped to half a short ladder's hop, and the delayed exchange.
func TestConfig_LimitsAreThePublishersWithoutConnecting(t *testing.T) {
	url := "amqp://u:p@127.0.0.1:1/"
	for _, c := range []struct {
		name                 string
		cfg                  Config
		precision, lookahead time.Duration
	}{
		{"defaults", Config{URL: url}, DefaultUnit + DefaultLead, LadderLookahead},
		{"lead 2s", Config{URL: url, Lead: 2 * time.Second}, DefaultUnit + 2*time.Second, 2 * time.Second},
		{"no lead", Config{URL: url, Lead: -1}, DefaultUnit, DefaultUnit},
		{"short ladder", Config{URL: url, Depth: 4}, DefaultUnit + 750*time.Millisecond, 750 * time.Millisecond},
		{"delayed exchange", Config{URL: url, Mode: ModeDelayedExchange}, delayedPrecision, DelayedExchangeLookahead},
	} {
		l, err := c.cfg.Limits()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if l.Precision != c.precision || l.Lookahead != c.lookahead {
			t.Errorf("%s: precision %v, lookahead %v; want %v and %v", c.name, l.Precision, l.Lookahead, c.precision, c.lookahead)
		}
	}
	// The default prefetch holds what arrives early at 5.9k due a second.
	if held := int(5900 * (DefaultUnit + DefaultLead).Seconds()); DefaultPrefetch < held {
		t.Errorf("DefaultPrefetch %d under the %d messages unit + lead (%v) hold at 5.9k due a second", DefaultPrefetch, held, DefaultUnit+DefaultLead)
	}
	if _, err := (Config{URL: url, Depth: 1, Lead: 250 * time.Millisecond}).Limits(); err == nil {
		t.Error("Limits of a ladder whose hops cannot make progress: no error")
	}
}
