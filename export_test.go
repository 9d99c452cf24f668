package delaybridge

import "github.com/delaybridge/delaybridge/internal/driver"

// Flat returns the flat broker settings c holds, for the tests of the
// loader.
func Flat(c Config) *driver.Settings { return c.flat }
