// Package delaybridge makes "do X at time T" reliable on the message
// brokers a service already runs (RabbitMQ, RocketMQ) and its MySQL or
// MariaDB database.
//
// A service writes each delayed task into the outbox table in the
// transaction of its own business change (Client.Schedule); the relay
// publishes it as a broker delayed message shortly before it is due,
// chaining hops when the delay is longer than the broker allows; the
// consumer runs the handler registered for its topic (Client.Handle) no
// earlier than the due time, in the transaction that marks the task done,
// and then acknowledges the message; the scanner publishes again what a
// broker lost. Cancel and Reschedule work in the caller's transaction, and
// Overdue answers "due and not done?" for reads that must not show a stale
// state.
//
// Client is the entry point: NewClient with a Config (LoadConfig reads it
// from flags, DELAYBRIDGE_* variables and a config file, as the delaybridge
// daemon does), Handle, Start, Stop. The broker is a value: rabbit.New or
// rocket.New, or the adapter --broker names, which the program links by
// importing its package. The packages below it are usable on
// their own: outbox (the table, the relay, Handle), broker (messages, the
// consumer runtime), rabbit and rocket (the adapters), scanner. README.md
// walks through an order service; docs/design.md explains the design.
package delaybridge
