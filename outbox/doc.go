// Package outbox keeps delayed tasks in the caller's MySQL or MariaDB
// database: the delay_task table and its migrations, Schedule, Cancel,
// Reschedule and Get inside the caller's transaction, the relay that
// publishes pending rows once the broker confirmed them, and Handle, which runs
// a handler and marks its task done in one transaction so its effect happens
// exactly once.
package outbox
