package percentile

import (
	"slices"
	"testing"
)

func TestSummarize_NearestRankAndMax(t *testing.T) {
	if got := Summarize(nil); got != (Summary{}) {
		t.Errorf("Summarize(nil) = %+v, want zero", got)
	}
	ms := make([]int64, 100)
	for i := range ms {
		ms[i] = int64(100 - i) // 100 … 1, unsorted
	}
	before := slices.Clone(ms)
	want := Summary{Count: 100, P50: 51, P90: 91, P99: 100, Max: 100}
	if got := Summarize(ms); got != want {
		t.Errorf("Summarize = %+v, want %+v", got, want)
	}
	if !slices.Equal(ms, before) {
		t.Error("Summarize reordered its input")
	}
}
