-- Leases: a relay or scanner claims rows in a short transaction that commits,
-- then publishes outside any transaction. lease_owner names the claim (a
-- random non-zero number; 0 means no lease) and next_attempt_ms holds the
-- lease's expiry, after which another claim may take the row. The claim
-- marks a row published, dead or backed off only while lease_owner is still
-- its own, so a Cancel or Reschedule that lands meanwhile wins and never
-- waits for a broker.
--
-- attempts is the handler attempt the task is on, as the consumer records
-- it before each retry (outbox.RecordRetry): the scanner re-publishes a
-- task with it, so a rescue neither restarts the count nor bypasses
-- MaxAttempts.
--
-- Both columns are fixed-width and appended, which MariaDB 10.3+ does in
-- place without copying the table. Migrate treats "duplicate column" as
-- already applied, so a crash between this ALTER and its record is safe.
ALTER TABLE delay_task
  ADD COLUMN lease_owner BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN attempts INT NOT NULL DEFAULT 0;
