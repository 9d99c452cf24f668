// Package scanner is the database backstop: it finds published tasks that
// are overdue and not done, publishes them again, flags relay and dead
// backlogs, and optionally hands keys from a business query straight to a
// handler. Several instances may run at once without rescuing a task twice.
package scanner
