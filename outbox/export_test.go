package outbox

// CountQuery is the background count's query, for EXPLAIN in tests.
const CountQuery = countQuery

// CleanerDuty is the duty a Cleaner runs with, its default applied.
func CleanerDuty(c *Cleaner) float64 { return c.cfg.Duty }
