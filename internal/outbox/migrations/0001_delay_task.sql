-- delay_task is the outbox the relay drains and the ledger Handle checks.
-- Times are epoch milliseconds (UTC by definition), never DATETIME, so no
-- session or server time zone can shift them.
CREATE TABLE IF NOT EXISTS delay_task (
  id               BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  topic            VARCHAR(127) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  task_key         VARBINARY(255) NOT NULL,
  due_ms           BIGINT NOT NULL,
  payload          MEDIUMBLOB NOT NULL,
  headers          TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  trace            VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  state            VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  generation       BIGINT NOT NULL DEFAULT 0,
  publish_attempts INT NOT NULL DEFAULT 0,
  next_attempt_ms  BIGINT NOT NULL DEFAULT 0,
  rescues          INT NOT NULL DEFAULT 0,
  last_error       VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  created_ms       BIGINT NOT NULL,
  updated_ms       BIGINT NOT NULL,
  published_ms     BIGINT NULL,
  done_ms          BIGINT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_delay_task_topic_key (topic, task_key),
  -- The relay claims (state = 'pending', due_ms <= horizon), the scanner reads
  -- (state = 'published', due_ms < now - grace) and the cleaner deletes
  -- (state IN ('done', 'cancelled'), due_ms < now - retention): all three are
  -- range scans of this one index, oldest first.
  KEY ix_delay_task_state_due (state, due_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
