// Package outbox is the implementation behind the delay_task table: Schedule,
// Cancel, Reschedule and Get in the caller's transaction, the relay, Handle
// and the group-commit consumer, the cleaner, the counts refresher and the
// presence records. Users reach it through the root package's Client; the
// public package github.com/delaybridge/delaybridge/outbox holds the table's
// migrations.
package outbox
