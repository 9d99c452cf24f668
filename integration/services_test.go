package integration

// Shared helpers for tests against the local services of scripts/services.sh.
// Settings and their defaults (exactly what that script sets up) live in
// internal/testenv; these wrap them in the shapes the integration tests use.
// An unreachable service fails the test under CI=true and skips it elsewhere,
// with "<service> unreachable at <where>: <err> (run scripts/services.sh up)".
// Under -short (make test-unit) they skip without looking for the service.

import (
	"database/sql"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/rlog"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// requireMySQL returns a pool on the delaybridge database
// (DELAYBRIDGE_MYSQL_DSN), closed at cleanup.
func requireMySQL(t testing.TB) *sql.DB {
	t.Helper()
	skipIfShort(t)
	return testenv.MySQL(t)
}

// requireAMQP returns a connection to RabbitMQ (DELAYBRIDGE_AMQP_URL), closed
// at cleanup.
func requireAMQP(t testing.TB) *amqp.Connection {
	t.Helper()
	skipIfShort(t)
	raw := testenv.AMQP(t)
	conn, err := amqp.DialConfig(raw, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		where := "DELAYBRIDGE_AMQP_URL"
		if u, perr := url.Parse(raw); perr == nil {
			where = u.Redacted()
		}
		testenv.Unreachable(t, "RabbitMQ", where, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func skipIfShort(t testing.TB) {
	t.Helper()
	testenv.SkipIfShort(t, "needs the local services")
}

var quietRocketMQ sync.Once

// requireRocketMQ returns the name server address
// (DELAYBRIDGE_ROCKETMQ_NAMESRV) once it accepts connections, and turns the
// RocketMQ client's logging down to errors.
func requireRocketMQ(t testing.TB) string {
	t.Helper()
	skipIfShort(t)
	quietRocketMQ.Do(func() { rlog.SetLogLevel("error") })
	return testenv.RocketMQ(t)
}

// uniqueName returns prefix plus a suffix unique to this run, legal as a
// table, queue and topic name alike.
func uniqueName(prefix string) string { return testenv.Name(prefix) }
