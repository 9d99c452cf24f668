// Package brokertest is the conformance suite every broker adapter runs
// against its real broker. An adapter is done when TestAdapter passes for it,
// switched by a Features value that says what the broker can and cannot do.
package brokertest
