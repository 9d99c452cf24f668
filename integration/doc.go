// Package integration holds the tests that run delaybridge against the real
// local MariaDB, RabbitMQ and RocketMQ started by scripts/services.sh. When
// CI=true a service that cannot be reached fails the test; it never skips.
package integration
