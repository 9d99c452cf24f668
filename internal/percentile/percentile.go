// Package percentile summarises latency samples for the demo, the bench
// and the operator's lateness figures (internal/ops).
package percentile

import "slices"

// Summary is the count, nearest-rank percentiles and maximum of samples
// (milliseconds). It has the fields of ops.Lateness, which converts
// from it.
type Summary struct {
	Count int   `json:"count"`
	P50   int64 `json:"p50"`
	P90   int64 `json:"p90"`
	P99   int64 `json:"p99"`
	Max   int64 `json:"max"`
}

// Summarize returns the percentiles of samples in milliseconds; the zero
// Summary for none. It leaves ms as it was.
func Summarize(ms []int64) Summary {
	if len(ms) == 0 {
		return Summary{}
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	at := func(p float64) int64 { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return Summary{Count: len(s), P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: s[len(s)-1]}
}
