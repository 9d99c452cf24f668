package outbox

// CleanerDuty is the duty a Cleaner runs with, its default applied.
func CleanerDuty(c *Cleaner) float64 { return c.cfg.Duty }
