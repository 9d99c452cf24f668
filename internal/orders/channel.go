package orders

import "sync"

// Channel is a payment provider, simulated in memory. Between a payment's
// start and its callback the channel reports it pending, and the timeout
// must wait for it. The zero value is ready to use; a nil *Channel has no
// payment pending.
type Channel struct {
	mu      sync.Mutex
	pending map[string]bool
}

// Start records that order id's payment is under way at the channel.
func (c *Channel) Start(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending = map[string]bool{}
	}
	c.pending[id] = true
}

// Settle records that order id's payment has finished at the channel,
// captured or failed.
func (c *Channel) Settle(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, id)
}

// Pending reports whether order id has a payment under way at the channel.
func (c *Channel) Pending(id string) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending[id]
}
