// Package cli holds the helpers the delaybridge binary's commands share
// with its console and its benchmark: text made safe to print, durations
// in words, due times as operators type them, and the bounded HTTP server.
package cli
