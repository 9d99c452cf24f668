package delaybridge

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/redact"
	"github.com/delaybridge/delaybridge/internal/settings"
	"github.com/delaybridge/delaybridge/rabbit"
	"github.com/delaybridge/delaybridge/rocket"
)

// Connection is an opened broker adapter: its publisher and, for a
// consumer, its subscriber, both signed when Config.SigningKeys is set.
type Connection struct {
	// Publisher publishes tasks, hops, retries and dead letters.
	Publisher broker.Publisher
	// Subscriber is nil unless the connection was opened for a consumer.
	Subscriber broker.Subscriber
	// Addr is the broker address a readiness check dials.
	Addr string

	ensure func(ctx context.Context, topics ...string) error
	close  func()
}

// CreateTopics creates topics that must exist before a consumer starts
// (RocketMQ; with a subscriber also each group's retry topic, so a nack
// comes back in a second). It does nothing on RabbitMQ, whose adapter
// declares its queues itself.
func (c *Connection) CreateTopics(ctx context.Context, topics ...string) error {
	return c.ensure(ctx, topics...)
}

// Close closes the subscriber, then the publisher.
func (c *Connection) Close() { c.close() }

// OpenBroker connects the configured broker adapter, the way delaybridge
// run does; withSubscriber also builds a subscriber. It checks c first.
func (c Config) OpenBroker(ctx context.Context, withSubscriber bool) (*Connection, error) {
	ring, err := c.Keyring()
	if err != nil {
		return nil, err
	}
	conn, err := c.openAdapter(ctx, withSubscriber)
	if err != nil {
		return nil, err
	}
	if ring != nil {
		conn.Publisher = broker.Signed(conn.Publisher, ring)
		if conn.Subscriber != nil {
			conn.Subscriber = broker.Verified(conn.Subscriber, ring)
		}
	}
	return conn, nil
}

func (c Config) openAdapter(ctx context.Context, withSub bool) (*Connection, error) {
	switch c.Broker {
	case "rabbit":
		cfg, err := c.RabbitConfig()
		if err != nil {
			return nil, err
		}
		pub, err := rabbit.NewPublisher(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("rabbit %s: %w", rabbit.RedactURL(c.AMQPURL), redact.Scrub(err, c.AMQPURL))
		}
		conn := &Connection{Publisher: pub, close: func() { c.closeLogged("publisher", pub) }, ensure: func(context.Context, ...string) error { return nil }}
		if u, err := url.Parse(c.AMQPURL); err == nil {
			port := u.Port()
			if port == "" {
				port = map[bool]string{true: "5671", false: "5672"}[u.Scheme == "amqps"]
			}
			conn.Addr = net.JoinHostPort(u.Hostname(), port)
		}
		if withSub {
			sub, err := rabbit.NewSubscriber(cfg)
			if err != nil {
				_ = pub.Close()
				return nil, err
			}
			conn.Subscriber = sub
			conn.close = func() { c.closeLogged("subscriber", sub); c.closeLogged("publisher", pub) }
		}
		return conn, nil
	case "rocket":
		cfg, err := c.RocketConfig()
		if err != nil {
			return nil, err
		}
		pub, err := rocket.NewPublisher(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("rocket %s: %w", c.RocketNameServers, redact.Scrub(err, c.RocketSecretKey))
		}
		conn := &Connection{Publisher: pub, close: func() { c.closeLogged("publisher", pub) }, Addr: cfg.NameServers[0]}
		var rsub *rocket.Subscriber
		conn.ensure = func(ctx context.Context, topics ...string) error {
			for _, t := range topics {
				tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				var err error
				if rsub != nil {
					err = rsub.CreateTopic(tctx, c.RocketBrokerAddr, t, c.RocketQueues)
				} else {
					err = pub.CreateTopic(tctx, c.RocketBrokerAddr, t, c.RocketQueues)
				}
				cancel()
				if err != nil {
					return err
				}
			}
			return nil
		}
		if withSub {
			sub, err := rocket.NewSubscriber(cfg)
			if err != nil {
				_ = pub.Close()
				return nil, err
			}
			conn.Subscriber = sub
			rsub = sub
			conn.close = func() { c.closeLogged("subscriber", sub); c.closeLogged("publisher", pub) }
		}
		return conn, nil
	}
	return nil, fmt.Errorf("--broker %q: want rabbit or rocket", c.Broker)
}

// closeLogged closes one client of a Connection, logging a failure: Close
// has nowhere to return it, and a broker that refused a clean shutdown is
// worth a line.
func (c Config) closeLogged(what string, cl interface{ Close() error }) {
	if err := cl.Close(); err != nil {
		logger := c.Logger
		if logger == nil {
			logger = slog.Default()
		}
		logger.Warn("delaybridge: closing the broker "+what+" failed", "broker", c.Broker, "err", err)
	}
}

// MySQLConfig parses MySQLDSN and applies MySQLTLS. parseTime is on unless
// the DSN says otherwise. A DSN without a database name is an error. An empty DSN is an error naming every way to set it, not the
// driver's defaults: a daemon must not quietly try root@127.0.0.1 against
// whatever database answers.
func (c Config) MySQLConfig() (*mysql.Config, error) {
	tc, err := c.MySQLTLS.Config("mysql")
	if err != nil {
		return nil, err
	}
	if c.MySQLDSN == "" {
		return nil, &settings.NotConfiguredError{Setting: "mysql-dsn", What: "no outbox database configured"}
	}
	cfg, err := mysql.ParseDSN(c.MySQLDSN)
	if err != nil {
		return nil, fmt.Errorf("--mysql-dsn %s: %w; %s", redact.DSN(c.MySQLDSN), redact.Scrub(err, c.MySQLDSN), settings.DSNFormHint(c.MySQLDSN))
	}
	if cfg.DBName == "" {
		// The driver connects without one, and every statement on the
		// outbox table then fails with "No database selected".
		return nil, fmt.Errorf("--mysql-dsn %s names no database: the outbox table lives in one; want the go-sql-driver form %s", redact.DSN(c.MySQLDSN), settings.DSNForm)
	}
	if !strings.Contains(c.MySQLDSN, "parseTime=") {
		cfg.ParseTime = true
	}
	if !strings.Contains(c.MySQLDSN, "interpolateParams=") && interpolationSafe(cfg.Collation) {
		// Arguments sent inside the statement: one round trip per statement
		// instead of three (prepare, execute, close). Under load those
		// round trips were most of the relay's and the consumer's database
		// time.
		cfg.InterpolateParams = true
	}
	if tc != nil {
		if cfg.TLSConfig != "" {
			return nil, fmt.Errorf("--mysql-tls-* flags and tls=%s in --mysql-dsn: use one", cfg.TLSConfig)
		}
		cfg.TLS = tc
	}
	return cfg, nil
}

// interpolationSafe reports whether the driver may put arguments into the
// statement text under collation: not for the multi-byte character sets
// where a backslash can be the second byte of a character.
func interpolationSafe(collation string) bool {
	for _, unsafe := range []string{"big5", "gbk", "gb2312", "gb18030", "sjis", "cp932"} {
		if strings.HasPrefix(strings.ToLower(collation), unsafe) {
			return false
		}
	}
	return true
}

// DefaultMaxIdleConns is how many idle connections OpenDB keeps open.
// database/sql keeps 2 unless told, and closes every other connection as
// it is released; a relay's claim loops (8 on RocketMQ) and probe, the
// scanner, the cleaner and a consumer's group workers (up to 8) use up to
// about twenty at once, so with 2 a busy process opens a new connection
// for most claims and groups (docs/tuning.md, "The defaults"). A service
// that opens its own *sql.DB for NewClient should keep as many.
const DefaultMaxIdleConns = 20

// OpenDB opens and pings the outbox database, keeping up to
// DefaultMaxIdleConns connections idle; the password never appears in the
// error.
func (c Config) OpenDB(ctx context.Context) (*sql.DB, error) {
	cfg, err := c.MySQLConfig()
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", redact.DSN(c.MySQLDSN), redact.Scrub(err, c.MySQLDSN))
	}
	db := sql.OpenDB(conn)
	db.SetMaxIdleConns(DefaultMaxIdleConns)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("database %s: %w", redact.DSN(c.MySQLDSN), redact.Scrub(err, c.MySQLDSN))
	}
	return db, nil
}
