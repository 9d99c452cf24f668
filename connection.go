package delaybridge

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/redact"
	"github.com/delaybridge/delaybridge/internal/settings"
)

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
