package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// progress draws a one-line progress bar on stderr.
type progress struct {
	w     io.Writer
	total int
}

func newProgress(w io.Writer, total int) *progress { return &progress{w: w, total: total} }

func (p *progress) line(published int, handled int64) {
	const width = 30
	fill := int(float64(width) * float64(handled) / float64(p.total))
	fmt.Fprintf(p.w, "\r[%s%s] published %d/%d handled %d/%d ", strings.Repeat("#", fill), strings.Repeat(".", width-fill), published, p.total, handled, p.total)
}

func (p *progress) loop(ctx context.Context, run *benchRun) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.line(int(run.relayed.Load()), run.count.Load())
	}
}

func (p *progress) done(run *benchRun) {
	fmt.Fprintf(p.w, "\rhandled %d/%d%s\n", run.count.Load(), p.total, strings.Repeat(" ", 60))
}
