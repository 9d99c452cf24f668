package settings

import "fmt"

// NotConfiguredError is the error for a required setting left unset: it
// names every way to set it.
type NotConfiguredError struct {
	// Setting is the flag name, e.g. "amqp-url".
	Setting string
	// What says what is missing, e.g. "no RabbitMQ configured".
	What string
}

// Error names the missing setting and every way to set it: a secret one
// (a URL or DSN with a password) also from its -file twin, where only demo
// and bench fall back to the local development services; the others from
// the flag, the environment or --config.
func (e *NotConfiguredError) Error() string {
	f := e.Setting
	if !isSecretSetting(f) {
		return fmt.Sprintf("%s: set --%s (environment %s, or %s in --config)", e.What, f, EnvName(f), f)
	}
	return fmt.Sprintf("%s: set --%s or --%s%s (environment %s or %s, or %s%s in --config); only demo and bench fall back to the local development services",
		e.What, f, f, SecretFileSuffix, EnvName(f), EnvName(f+SecretFileSuffix), f, SecretFileSuffix)
}
