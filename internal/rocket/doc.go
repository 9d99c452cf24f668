// Package rocket is the RocketMQ adapter's implementation. Users import the
// public package github.com/delaybridge/delaybridge/rocket, whose
// documentation explains timer and level mode.
package rocket
