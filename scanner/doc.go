// Package scanner is the database backstop: it finds published tasks that
// are overdue and not done, publishes them again, flags relay and dead
// backlogs, and optionally hands keys from a business query straight to a
// handler. Several instances may run at once without rescuing a task twice.
//
// The client runs it when delaybridge.Config.Scanner is set, and
// delaybridge run runs it unless --no-scanner.
package scanner

import "github.com/delaybridge/delaybridge/internal/scanner"

// Config tunes the scanner; zero fields take their defaults
// (each field says its own; docs/flags.md explains run's --grace and the
// other flags that set them). The root package calls it ScannerConfig.
type Config = scanner.Config

// Business is a query for keys whose task should have run but may never
// have been written. The root package calls it BusinessSource.
type Business = scanner.Business
