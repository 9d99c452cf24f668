// Package orders is the order service of examples/ordertimeout: creating an
// order reserves stock and schedules its cancellation in the same
// transaction, paying cancels the task, the cancel handler releases stock
// exactly once, and reading an order applies the lazy check so an order
// past its cancel time never shows as UNPAID. delaybridge demo runs it too.
package orders
