package outbox

// Outbox, New and Config reach the writer and its limits, which the
// package's functions hold at their defaults.
type (
	Outbox = writer
	Config = config
)

// New returns a writer with cfg's limits.
func New(cfg Config) *Outbox { return newWriter(cfg) }

// MaxPayloadCeiling is the largest MaxPayload takes effect.
const MaxPayloadCeiling = maxPayloadCeiling

// CleanerDuty is the duty a Cleaner runs with, its default applied.
func CleanerDuty(c *Cleaner) float64 { return c.cfg.Duty }
