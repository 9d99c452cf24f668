// Package ops holds the operator's read-only queries of the outbox: the
// counts and figures of `delaybridge status` and /metrics, the console's
// search and charts, the dead list, the checks `doctor` and `run` make of
// the database. None of them writes a task.
package ops
