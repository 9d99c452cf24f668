-- A handler may snooze its task: "not yet, look again later" (Snooze).
-- snoozes counts them since the task was scheduled, rescheduled or
-- replayed, so a bound can stop a task that snoozes for ever. A snooze is
-- not a failed attempt: attempts does not count it.
--
-- One statement, safe to run again after a crash before the migration is
-- recorded: a column that exists already (error 1060) counts as done.
ALTER TABLE delay_task ADD COLUMN snoozes INT NOT NULL DEFAULT 0;
