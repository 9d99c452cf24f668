// Package bench is delaybridge bench: it schedules a workload through the
// outbox, runs the relay and a consumer in this process, and reports how
// late each task was handled, and whether any was lost, early or applied
// twice.
package bench
