package rabbit

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// PurgeTopic deletes every message waiting in topic's consumer queue,
// <prefix>.q.<topic> (docs/topology.md), and returns how many there were.
// Messages still on the ladder are not touched. What it deletes is gone,
// never handled: it is for benchmarks and tests that must start from an
// empty queue.
func PurgeTopic(ctx context.Context, cfg Config, topic string) (int, error) {
	if err := broker.ValidateTopic(topic); err != nil {
		return 0, err
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return 0, err
	}
	conn, err := dial(ctx, cfg, "purge")
	if err != nil {
		return 0, fmt.Errorf("rabbit: purge %s: %w", topic, err)
	}
	defer closeQuietly(conn)
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("rabbit: purge %s: open channel: %w", topic, err)
	}
	n, err := ch.QueuePurge(topology{cfg: cfg}.topicQueue(topic), false)
	if err != nil {
		return 0, fmt.Errorf("rabbit: purge %s: %w", topic, err)
	}
	return n, nil
}

// Inspection is what Inspect found on the broker a Config names.
type Inspection struct {
	// Version is the broker's version as it reports it.
	Version string
	// TLS is the TLS version the connection negotiated (tls.VersionName
	// names it), 0 on a plain connection.
	TLS uint16
	// QuorumDeadLettering is nil when a quorum queue with at-least-once
	// dead-lettering, the ladder's kind, could be declared (and was
	// deleted again), else what the broker said.
	QuorumDeadLettering error
	// Depth is the ladder depth checked (the Config's, or DefaultDepth).
	// LevelsMissing counts its level queues that do not exist; ExtraLevel
	// is set when a level past Depth exists (a ladder declared with other
	// settings). All three are zero outside ModeLadder.
	Depth         int
	LevelsMissing int
	ExtraLevel    bool
}

// Inspect connects to the broker cfg names and reads what doctor reports:
// its version, the connection's TLS, whether quorum queues dead-letter at
// least once, and in ModeLadder which of the ladder's level queues exist
// (passively: it declares nothing of the ladder). It returns an error
// only when no connection could be opened.
func Inspect(ctx context.Context, cfg Config) (*Inspection, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	conn, err := dial(ctx, cfg, "doctor")
	if err != nil {
		return nil, err
	}
	defer closeQuietly(conn)
	in := &Inspection{}
	if st := conn.ConnectionState(); st.HandshakeComplete {
		in.TLS = st.Version
	}
	in.Version, _ = conn.Properties["version"].(string)
	in.QuorumDeadLettering = probeQuorumDeadLettering(conn, cfg.Prefix)
	if cfg.Mode != ModeLadder {
		return in, nil
	}
	t := topology{cfg: cfg}
	in.Depth = cfg.Depth
	// A passive declare of a missing queue closes its channel: one each.
	exists := func(q string) (bool, error) {
		ch, err := conn.Channel()
		if err != nil {
			return false, err
		}
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
			return false, nil
		}
		_ = ch.Close()
		return true, nil
	}
	for k := range cfg.Depth {
		ok, err := exists(t.levelQueue(k))
		if err != nil {
			break
		}
		if !ok {
			in.LevelsMissing++
		}
	}
	in.ExtraLevel, _ = exists(t.levelQueue(cfg.Depth))
	return in, nil
}

// probeQuorumDeadLettering declares a throwaway quorum queue with
// at-least-once dead-lettering under prefix and deletes it.
func probeQuorumDeadLettering(conn *amqp.Connection, prefix string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close() //nolint:errcheck // a failed declare closed it already
	q := fmt.Sprintf("%s.doctor.%d", prefix, time.Now().UnixNano())
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
		"x-dead-letter-exchange": "amq.direct", "x-message-ttl": int64(1000)}); err != nil {
		return err
	}
	_, _ = ch.QueueDelete(q, false, false, false)
	return nil
}
