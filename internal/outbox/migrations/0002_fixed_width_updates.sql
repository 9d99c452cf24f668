-- Rows keep their size through their life, so InnoDB updates them in place.
--
-- The relay marks every row published and Handle marks it done. With state a
-- VARCHAR ('pending' -> 'published' adds 2 bytes) and published_ms / done_ms
-- NULL until set (a NULL takes no room, a BIGINT 8 bytes), each of those
-- updates grew the record: InnoDB rewrote it elsewhere in its page, and split
-- pages that had no room left. Measured on the 2-core test box with
-- BenchmarkRelayDatabase (200k rows, 4 relay workers, builds alternating):
-- 28-33k rows/s before, 52-53k rows/s after.
--
-- state becomes CHAR(16) ascii (fixed width; comparisons and reads ignore the
-- padding). published_ms and done_ms become NOT NULL DEFAULT 0, and 0 means
-- "not yet", as NULL did.
--
-- Safe to run again after a crash at any statement: the first ALTER only sets
-- defaults, the UPDATEs touch only NULLs, and the last ALTER is atomic. A
-- binary older than this migration writes published_ms = NULL when it
-- reschedules or replays a task, which this schema refuses: upgrade every
-- process that writes delay_task together.
--
-- The last ALTER copies the table (VARCHAR to CHAR cannot be done in place),
-- and writes to delay_task, Schedule inside business transactions included,
-- wait for the copy: on a large outbox, run it at a quiet time. Reads of
-- state assume the server does not run with sql_mode PAD_CHAR_TO_FULL_LENGTH
-- (deprecated, off by default).
ALTER TABLE delay_task
  MODIFY published_ms BIGINT NULL DEFAULT 0,
  MODIFY done_ms BIGINT NULL DEFAULT 0;
UPDATE delay_task SET published_ms = 0 WHERE published_ms IS NULL;
UPDATE delay_task SET done_ms = 0 WHERE done_ms IS NULL;
ALTER TABLE delay_task
  MODIFY state CHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  MODIFY published_ms BIGINT NOT NULL DEFAULT 0,
  MODIFY done_ms BIGINT NOT NULL DEFAULT 0;
