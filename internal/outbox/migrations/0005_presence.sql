-- delaybridge_presence: one row per running relay or consumer process,
-- with the broker topology it uses (broker.Topology as JSON: prefix,
-- consumer group, delay mode, limits, ladder unit and depth) and, for a
-- consumer, the topics it consumes. outbox.Announce writes the row when a
-- process starts, refreshes seen_ms every heartbeat (10 s by default) and
-- deletes it on a clean stop. Each process compares its topology with the
-- live rows of the others, so a relay and a consumer that disagree (relay
-- prefix "delaybridge", consumer "shop") say so, naming both values,
-- instead of leaving tasks in a queue nobody reads; status and /metrics
-- name topics with overdue tasks and no live consumer.
--
-- Times are the database's clock in epoch milliseconds, so hosts whose
-- clocks differ agree on which rows are live. The table holds a row per
-- process, never per task: its cost does not grow with the outbox.
CREATE TABLE IF NOT EXISTS delaybridge_presence (
  instance   VARCHAR(191) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  role       CHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topology   TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  topics     TEXT CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  started_ms BIGINT NOT NULL,
  seen_ms    BIGINT NOT NULL,
  PRIMARY KEY (instance)
) ENGINE = InnoDB;
