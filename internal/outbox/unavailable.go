package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// Server error numbers that say the database cannot take the work right
// now, whatever the task: too many connections, shutting down, read-only
// (a failover under way), the connection killed.
var unavailableCodes = map[uint16]bool{
	1040: true, // ER_CON_COUNT_ERROR
	1053: true, // ER_SERVER_SHUTDOWN
	1290: true, // ER_OPTION_PREVENTS_STATEMENT (--read-only)
	1792: true, // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
	1927: true, // ER_CONNECTION_KILLED (MariaDB)
}

// connectionLost reports whether err says the database could not be
// reached or dropped the connection, or refused the work for a reason of
// its own (unavailableCodes).
func connectionLost(err error) bool {
	var me *mysql.MySQLError
	var ne net.Error
	switch {
	case err == nil:
		return false
	case errors.As(err, &me):
		return unavailableCodes[me.Number]
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, mysql.ErrInvalidConn),
		errors.Is(err, sql.ErrConnDone):
		return true
	case errors.As(err, &ne):
		return true
	}
	return false
}

// asUnavailable wraps err, an error of one of Handle's or HandleGroup's
// own statements, with broker.ErrUnavailable when it says the database
// was lost (connectionLost) rather than anything about the task: the
// consumer runtime then gives the message back without counting an
// attempt. A lock wait timeout or a deadlock stays an attempt: it is one
// task's row, and a holder that never lets go must not keep its task
// going round for ever. An ended ctx is left as it is: the handler's
// timeout or a shutdown, which the runtime tells apart itself.
func asUnavailable(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil || errors.Is(err, broker.ErrUnavailable) || !connectionLost(err) {
		return err
	}
	return fmt.Errorf("%w: %w", broker.ErrUnavailable, err)
}

// beginFailed is asUnavailable for an error of BeginTx: whatever it is, it
// says nothing about the task.
func beginFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	return fmt.Errorf("%w: %w", broker.ErrUnavailable, err)
}
