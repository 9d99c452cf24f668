// Package orders is the order service of the order-timeout story:
// creating an order reserves stock and schedules its cancellation in the
// same transaction, paying cancels the task, the cancel handler releases
// stock exactly once, and reading an order applies the lazy check so an
// order past its cancel time never shows as UNPAID. The program
// examples/ordertimeout and delaybridge demo both run it; it lives here so
// that the binary depends on no example.
package orders
