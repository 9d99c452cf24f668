package cli

// The help of the relay flags that run and bench both take, so the two
// commands describe them alike. docs/flags.md explains them.
const (
	// LookaheadHelp is the help of --lookahead.
	LookaheadHelp = "publish this far ahead of due (default: broker's; 0 = all)"
	// RelayWorkersHelp is the help of --relay-workers.
	RelayWorkersHelp = "relay claim loops (0 = broker's: 8 RocketMQ, 4 RabbitMQ)"
	// RelayPaceHelp is the help of --relay-pace.
	RelayPaceHelp = "wait after a short relay claim (<0 = none)"
)
