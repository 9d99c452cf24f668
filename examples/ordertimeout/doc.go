// Package ordertimeout is a small order service: creating an order reserves
// stock and schedules its cancellation in the same transaction, paying
// cancels the task, and the cancel handler releases stock exactly once.
package ordertimeout
