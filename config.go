package delaybridge

import (
	"go.opentelemetry.io/otel/trace"
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/driver"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/settings"
)

// TLSFiles are the files of one TLS client setup, the --<name>-tls-ca,
// -cert, -key and -server-name settings. The zero value means no TLS.
type TLSFiles = settings.TLSFiles

// Config is what a Client, and the delaybridge binary, need to reach the
// outbox database and the broker. The relay (delaybridge run) and every
// consumer must agree on the broker's settings, so give them the same
// configuration.
//
// A service either builds its broker adapter in code (Broker) or loads
// the flat settings the daemon reads (LoadConfig, RegisterFlags): --broker
// and its settings, each with a flag, a DELAYBRIDGE_* environment variable
// and a config-file name (docs/cli.md). The adapter they name must be
// linked into the program: import its package.
type Config struct {
	// MySQLDSN is the outbox database in go-sql-driver format
	// (--mysql-dsn). parseTime is on unless the DSN says otherwise.
	MySQLDSN string
	// MySQLTLS is the database's TLS client setup (--mysql-tls-*).
	MySQLTLS TLSFiles

	// Broker is the broker adapter: rabbit.New or rocket.New builds one.
	// Nil means the one the flat settings name (--broker rabbit by
	// default).
	Broker broker.Adapter

	// SigningKeys signs every message and refuses unsigned deliveries:
	// id:base64secret entries, comma separated, the first signs
	// (--signing-keys; see SECURITY.md).
	SigningKeys string

	// Logger receives the adapters' and the consumer's logs. Default
	// slog.Default().
	Logger *slog.Logger

	// The fields below have no flag: they tune a Client in code.

	// Consumer tunes the consumer runtime a Client runs for its handlers
	// (concurrency, retries, group size, hooks). Its zero value is the
	// runtime's defaults; Logger fills its Logger.
	Consumer broker.ConsumerConfig
	// Relay, when not nil, makes a Client also run the relay in its
	// process with this configuration, for a service that is its own
	// daemon. Leave it nil where delaybridge run is deployed. A scanner
	// must run somewhere (Scanner, or delaybridge run): it re-publishes
	// what a relay that died mid-batch had claimed.
	Relay *RelayConfig
	// Scanner, when not nil, makes a Client also run the scanner in its
	// process with this configuration (see Relay).
	Scanner *ScannerConfig
	// Cleaner tunes the cleaner a Client with a Relay runs beside it, as
	// delaybridge run does: it deletes done and cancelled tasks past their
	// retention. The zero value is the cleaner's defaults (a week's
	// retention); Logger fills its Logger.
	Cleaner outbox.CleanerConfig
	// NoCleaner keeps a Client with a Relay from cleaning: set it where
	// another process cleans (delaybridge run) or finished tasks must stay.
	NoCleaner bool
	// Stats tunes the counts refresher a Client with a Relay runs beside
	// it, as delaybridge run does: it recounts tasks by state and topic
	// for status and /metrics. The zero value is the refresher's defaults,
	// with the scanner's grace; Logger fills its Logger.
	Stats outbox.StatsRefresherConfig
	// NoStats keeps a Client with a Relay from recounting.
	NoStats bool
	// Presence tunes the records a Client's consumer and relay keep in
	// the outbox (outbox.Announce): set WarnOnly while rolling a topology change out
	// process by process (docs/topology.md), so a consumer whose prefix,
	// mode or ladder differs from the still-running old ones starts and
	// logs the difference instead of refusing. Logger fills its Logger.
	Presence outbox.PresenceConfig
	// Metrics, when not nil, is fed by the consumer, relay and scanner a
	// Client runs (NewMetrics), beside any hooks set above: the consumer's
	// series (the lateness, hops, retries and dead the dashboard in
	// deploy/grafana shows, and its outcomes and group sizes) come from the
	// service that runs the handlers.
	Metrics *Metrics
	// TracerProvider, when set, makes OpenTelemetry spans: one for each
	// task the relay publishes ("send") or the scanner publishes again
	// ("rescue"), and one for each the handler runs ("process"), in the
	// context the handler receives. Each links to the span that
	// scheduled the task. Nil makes no spans and costs nothing. Schedule
	// records the caller's span either way (docs/deployment.md).
	TracerProvider trace.TracerProvider

	// flat are the broker settings by flag, read when Broker is nil.
	flat *driver.Settings
}

// DefaultConfig returns the default of every setting: the values the
// flags start from.
func DefaultConfig() Config {
	s := driver.Defaults()
	return Config{flat: &s}
}

// withDefaults fills what a Client needs and the caller left zero.
func (c Config) withDefaults() Config {
	if c.flat == nil {
		s := driver.Defaults()
		c.flat = &s
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// RegisterFlags adds every setting of c to fs as a flag bound to c, with
// c's current values as defaults: the database, the broker, the consumer
// settings and the -file companions of the secret ones.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	if c.flat == nil {
		s := driver.Defaults()
		c.flat = &s
	}
	settings.RegisterDatabaseFlags(fs, &c.MySQLDSN, c.MySQLTLS.Register)
	c.flat.RegisterFlags(fs)
	fs.StringVar(&c.SigningKeys, "signing-keys", c.SigningKeys, "sign and check messages: id:base64secret,... (first signs)")
	c.flat.RegisterConsumerFlags(fs)
	settings.RegisterSecretFiles(fs)
}

// adapter is Broker, or the one the flat settings name.
func (c Config) adapter() (broker.Adapter, error) {
	if c.Broker != nil {
		return c.Broker, nil
	}
	return c.withDefaults().flat.Adapter(c.Logger)
}

// Check reports bad settings without connecting: the signing keys and the
// broker adapter's settings. NewClient checks them too.
func (c Config) Check() error {
	_, _, err := c.check()
	return err
}

// check is Check, returning the adapter and its topology.
func (c Config) check() (broker.Adapter, broker.Topology, error) {
	if _, err := driver.Keyring(c.SigningKeys); err != nil {
		return nil, broker.Topology{}, err
	}
	a, err := c.adapter()
	if err != nil {
		return nil, broker.Topology{}, err
	}
	topo, err := a.Topology()
	if err != nil {
		return nil, broker.Topology{}, err
	}
	return a, topo, nil
}
