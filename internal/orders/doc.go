// Package orders is the order service delaybridge demo runs: creating an
// order reserves stock and schedules its cancellation in the same
// transaction, paying cancels the task, the cancel handler releases stock
// exactly once, and reading an order applies the lazy check so an order
// past its cancel time never shows as UNPAID. examples/ordertimeout tells
// the same story on the public API, for users to copy; the binary depends
// on no example.
package orders
