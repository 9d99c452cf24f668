package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/outbox"
)

// erSavepointMissing is MariaDB's error for a ROLLBACK TO SAVEPOINT whose
// savepoint does not exist (ER_SP_DOES_NOT_EXIST).
const erSavepointMissing = 1305

// In the group's second run, a message whose fn fails after the server lost
// the transaction under it leaves no savepoint to roll back to. The group
// must fail whole: carrying on would run the next messages outside any
// transaction, each write committing on its own, and mark tasks done whose
// effects were rolled back.
func TestHandleGroup_ASavepointTheServerLostFailsTheWholeGroup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := []string{"a", "poison", "b", "c"}
	var msgs []*broker.Message
	for _, k := range keys {
		msgs = append(msgs, b.order(t, k, time.Now()))
	}
	boom := errors.New("payment service down")
	ran := map[string]int{}
	_, _, err := outbox.HandleGroup(b.ctx, b.db, msgs, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		ran[m.Key]++
		if err := cancelOne(ctx, tx, m); err != nil {
			return err
		}
		switch m.Key {
		case "poison":
			// Fails the first run, so the group runs again with savepoints.
			return boom
		case "b":
			// b runs only in the second run (the first stopped at poison).
			// Its write done, the transaction is rolled back under the
			// group, as the server does to a deadlock's victim, and the
			// savepoint goes with it.
			if _, err := tx.ExecContext(ctx, "ROLLBACK"); err != nil {
				return err
			}
			return errors.New("b lost its transaction")
		}
		return nil
	})
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != erSavepointMissing {
		t.Errorf("HandleGroup = %v; want the group failed with its savepoint gone (error %d)", err, erSavepointMissing)
	}
	if ran["a"] != 2 || ran["poison"] != 1 || ran["b"] != 1 {
		t.Fatalf("fn ran %v; want a twice, poison once, b once: the rerun did not go as planned", ran)
	}
	for _, k := range keys {
		if status, cancels := b.orderRow(t, k); status != "UNPAID" || cancels != 0 {
			t.Errorf("%s: order %s with %d cancels after the group failed; want no effect kept", k, status, cancels)
		}
	}
	if n := b.count(t, "state = 'done'"); n != 0 {
		t.Errorf("%d tasks done after the group failed; want none", n)
	}
	if n := b.count(t, "state = 'pending'"); n != len(keys) {
		t.Errorf("%d of %d tasks still pending; want all, for each message to be handled alone", n, len(keys))
	}
}
