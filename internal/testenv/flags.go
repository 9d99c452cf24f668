package testenv

import "testing"

// RabbitFlags are the binary's broker flags for the local RabbitMQ: they
// give a test its own small ladder, deleted at cleanup.
func RabbitFlags(t testing.TB) []string {
	t.Helper()
	url := AMQP(t)
	prefix := Name("cli")
	t.Cleanup(func() { DeleteRabbitPrefix(t, url, prefix) })
	return []string{"--broker", "rabbit", "--amqp-url", url, "--rabbit-prefix", prefix, "--rabbit-depth", "8"}
}
