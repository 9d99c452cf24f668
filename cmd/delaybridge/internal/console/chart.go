package console

import (
	"fmt"
	"strings"

	"github.com/delaybridge/delaybridge/internal/ops"
)

// The overview's charts are inline SVG laid out here and drawn by the
// templates: no script, nothing fetched.

const (
	chartW    = 600
	chartH    = 160
	chartPadL = 48
	chartPadB = 20
)

// bar is one bar of a barChart, in SVG user units.
type bar struct {
	X, Y, W, H float64
	Value      int
	Label      string
}

// barChart is a bar per bucket, scaled to the largest.
type barChart struct {
	W, H, PadL, PlotH int
	Bars              []bar
	Max               int
}

func newBarChart(values []int, label func(i int) string) barChart {
	c := barChart{W: chartW, H: chartH, PadL: chartPadL, PlotH: chartH - chartPadB}
	for _, v := range values {
		c.Max = max(c.Max, v)
	}
	if len(values) == 0 {
		return c
	}
	slot := float64(chartW-chartPadL) / float64(len(values))
	for i, v := range values {
		h := 0.0
		if c.Max > 0 {
			h = float64(v) / float64(c.Max) * float64(c.PlotH-4)
		}
		c.Bars = append(c.Bars, bar{X: float64(chartPadL) + float64(i)*slot + 2, Y: float64(c.PlotH) - h, W: slot - 4, H: h, Value: v, Label: label(i)})
	}
	return c
}

// series is one line of a lineChart.
type series struct {
	Name   string
	Class  string
	Points string
}

// lineChart draws lateness percentiles per bucket.
type lineChart struct {
	W, H, PadL, PlotH int
	Lines             []series
	MaxMS             int64
	Labels            []bar
	Empty             bool
}

func newLatenessChart(ls []ops.Lateness, label func(i int) string) lineChart {
	c := lineChart{W: chartW, H: chartH, PadL: chartPadL, PlotH: chartH - chartPadB, Empty: true}
	for _, l := range ls {
		if l.Count > 0 {
			c.Empty = false
			c.MaxMS = max(c.MaxMS, l.P99)
		}
	}
	if len(ls) == 0 {
		return c
	}
	slot := float64(chartW-chartPadL) / float64(len(ls))
	y := func(ms int64) float64 {
		if c.MaxMS <= 0 {
			return float64(c.PlotH)
		}
		return float64(c.PlotH) - float64(max(ms, 0))/float64(c.MaxMS)*float64(c.PlotH-4)
	}
	for _, s := range []struct {
		name, class string
		pick        func(ops.Lateness) int64
	}{
		{"p50", "p50", func(l ops.Lateness) int64 { return l.P50 }},
		{"p90", "p90", func(l ops.Lateness) int64 { return l.P90 }},
		{"p99", "p99", func(l ops.Lateness) int64 { return l.P99 }},
	} {
		var pts []string
		for i, l := range ls {
			if l.Count == 0 {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", float64(chartPadL)+(float64(i)+0.5)*slot, y(s.pick(l))))
		}
		c.Lines = append(c.Lines, series{Name: s.name, Class: s.class, Points: strings.Join(pts, " ")})
	}
	for i := range ls {
		c.Labels = append(c.Labels, bar{X: float64(chartPadL) + float64(i)*slot, W: slot, Label: label(i)})
	}
	return c
}
