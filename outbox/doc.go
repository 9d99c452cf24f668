// Package outbox is the delay_task table that holds every delayed task in
// the service's own MySQL or MariaDB database. Tasks are written, cancelled
// and rescheduled through delaybridge.Client, inside the caller's
// transaction.
//
// This package holds the table's migrations: Migrate applies them, and
// Migrations returns their SQL for a service that applies schema changes with
// its own tool. CheckSchema tells whether a database has them all.
// docs/table-contract.md describes the columns and what each state means.
package outbox
