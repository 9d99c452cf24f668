// Package orders is the order service delaybridge demo runs. Creating an
// order reserves stock and schedules its cancellation in the same
// transaction; paying cancels the task. The cancel handler releases stock
// exactly once, and snoozes while the payment channel still has a payment
// of the order pending. A payment that arrives after the cancellation is
// refused and refunded by a task of its own. Reading an order past its
// cancel time cancels it there and then, so no reader sees a stale UNPAID.
// examples/ordertimeout tells the same story on the public API, for users
// to copy; the binary depends on no example.
package orders
