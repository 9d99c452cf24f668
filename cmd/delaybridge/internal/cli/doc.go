// Package cli holds the helpers the delaybridge binary's commands share
// with its console and its benchmark: text made safe to print, durations
// in words, due times as operators type them, the bounded HTTP server,
// the session of an opened database and broker, status's signals, and the
// help of the relay flags that run and bench both take.
package cli
