-- The claim index also holds next_attempt_ms, so a claim skips the rows
-- another claim holds under lease (and rows backing off after a failed
-- publish) from the index alone. With next_attempt_ms only in the table, a
-- claim read each of those rows to learn it could not take it: with 4 relay
-- loops of 1,000 rows, up to 3,000 primary-key lookups per claim.
--
-- One statement, so a crash leaves the old index or the new one; run again,
-- it drops and builds the new one anew. MariaDB and MySQL 8 build it in
-- place without blocking writes.
ALTER TABLE delay_task
  DROP INDEX ix_delay_task_state_due,
  ADD INDEX ix_delay_task_state_due (state, due_ms, next_attempt_ms);
