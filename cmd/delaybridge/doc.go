// Command delaybridge is the one binary for operators and developers:
// migrate, run the relay and scanner as a daemon with metrics and health over
// HTTP, inspect and repair tasks, check a live broker with doctor, benchmark,
// and run the order-timeout demo.
package main
