package bench

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/percentile"
)

// trickle is --trickle: a second topic that gets one task a transaction,
// at a steady rate, as an order service creates orders, from before the
// main workload starts until it is handled. Its lateness and its
// transactions' times are reported by phase, so a run shows what the main
// workload did to another topic and to the order service.
type trickle struct {
	topic string
	id    string
	rate  float64
	delay time.Duration
	db    *sql.DB

	mu    sync.Mutex
	tasks []trickleTask // by the number in the key
	err   error         // the first scheduling error
}

type trickleTask struct {
	scheduled int64 // unix ms the transaction began
	txMicros  int64 // how long it took, begin to commit; 0 = failed
	due       int64 // unix ms
	sent      int64 // the relay's first publish of it began, unix ms
	published int64 // the broker first confirmed it, unix ms
	delivered int64 // first handed to the consumer runtime, unix µs
	handled   int64 // first handled, unix µs; 0 = not yet
	runs      int
}

func newTrickle(db *sql.DB, topic string, rate float64, delay time.Duration) *trickle {
	return &trickle{topic: topic, id: "t" + strconv.FormatInt(time.Now().UnixMilli(), 36), rate: rate, delay: delay, db: db}
}

func (t *trickle) key(i int) string { return t.id + "-" + strconv.Itoa(i) }

// seen records a handler run of the task of key at now.
func (t *trickle) seen(key string, now time.Time) {
	t.note(key, func(task *trickleTask) {
		task.runs++
		if task.handled == 0 {
			task.handled = now.UnixMicro()
		}
	})
}

// note applies f to the task of key, if key is one of the trickle's.
func (t *trickle) note(key string, f func(*trickleTask)) {
	rest, ok := strings.CutPrefix(key, t.id+"-")
	if !ok {
		return
	}
	i, err := strconv.Atoi(rest)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil && i >= 0 && i < len(t.tasks) {
		f(&t.tasks[i])
	}
}

// run schedules a task every 1/rate until ctx ends, each in its own
// transaction with its order row, and nudges the relay after each commit
// unless nudge is nil. A slow transaction does not hold back the next.
func (t *trickle) run(ctx context.Context, nudge func()) {
	every := time.Duration(float64(time.Second) / t.rate)
	tick := time.NewTicker(every)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.mu.Lock()
		i := len(t.tasks)
		start := time.Now()
		t.tasks = append(t.tasks, trickleTask{scheduled: start.UnixMilli(), due: start.Add(t.delay).UnixMilli()})
		t.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := t.schedule(ctx, i, start)
			took := time.Since(start).Microseconds()
			t.mu.Lock()
			defer t.mu.Unlock()
			if err != nil {
				if t.err == nil && ctx.Err() == nil {
					t.err = fmt.Errorf("trickle: %w", err)
				}
				t.tasks[i].due = 0 // never scheduled: not counted
				return
			}
			t.tasks[i].txMicros = max(took, 1)
			if nudge != nil {
				nudge()
			}
		}()
	}
}

// schedule is the order transaction: the order row, then its task.
func (t *trickle) schedule(ctx context.Context, i int, start time.Time) error {
	tx, err := t.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, "INSERT INTO bench_orders (id, status) VALUES (?, 'UNPAID')", t.key(i)); err != nil {
		return err
	}
	if _, err := outbox.Schedule(ctx, tx, outbox.Task{Topic: t.topic, Key: t.key(i), DueAt: start.Add(t.delay)}); err != nil {
		return err
	}
	return tx.Commit()
}

// failed returns the first scheduling error, nil if none.
func (t *trickle) failed() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// wait waits until every task scheduled is handled or deadline passes.
func (t *trickle) wait(ctx context.Context, deadline time.Time) {
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if t.summary(0, 1<<62, "").Lost == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tricklePhase is what the trickle saw in one phase of the run: its tasks
// due then, and its order transactions begun then.
type tricklePhase struct {
	Name  string `json:"phase"`
	Tasks int    `json:"tasks"`
	Lost  int    `json:"lost"`
	Early int    `json:"early"`
	// Lateness, and its shares Sent (the relay's publish began),
	// Published (the broker confirmed it) and Delivered (handed to the
	// consumer runtime), each after due, are in ms; OrderTx, the order transaction with
	// its Schedule, in µs.
	Lateness  percentile.Summary `json:"lateness_ms"`
	Sent      percentile.Summary `json:"sent_late_ms"`
	Published percentile.Summary `json:"published_late_ms"`
	Delivered percentile.Summary `json:"delivered_late_ms"`
	OrderTx   percentile.Summary `json:"order_tx_us"`
}

// summary returns the phase [from, to) of unix ms.
func (t *trickle) summary(from, to int64, name string) tricklePhase {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := tricklePhase{Name: name}
	var late, tx, sent, published, delivered []int64
	for _, task := range t.tasks {
		if task.txMicros > 0 && task.scheduled >= from && task.scheduled < to {
			tx = append(tx, task.txMicros)
		}
		if task.due == 0 || task.txMicros == 0 || task.due < from || task.due >= to {
			continue
		}
		p.Tasks++
		if task.sent > 0 {
			sent = append(sent, max(task.sent-task.due, 0))
		}
		if task.published > 0 {
			published = append(published, max(task.published-task.due, 0))
		}
		if task.delivered > 0 {
			delivered = append(delivered, max(task.delivered/1000-task.due, 0))
		}
		switch {
		case task.handled == 0:
			p.Lost++
		case task.handled/1000 < task.due:
			p.Early++
		default:
			late = append(late, task.handled/1000-task.due)
		}
	}
	p.Lateness, p.OrderTx = percentile.Summarize(late), percentile.Summarize(tx)
	p.Sent, p.Published, p.Delivered = percentile.Summarize(sent), percentile.Summarize(published), percentile.Summarize(delivered)
	return p
}

// duplicates counts the trickle's tasks that ran more than once; with
// the database handler, those whose effect was applied more than once.
func (t *trickle) duplicates(ctx context.Context, dbHandler bool) (int64, error) {
	if dbHandler {
		var n int64
		err := t.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM bench_orders WHERE id LIKE ? AND effects > 1", t.id+"-%").Scan(&n)
		return n, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var n int64
	for _, task := range t.tasks {
		if task.runs > 1 {
			n++
		}
	}
	return n, nil
}

// printPhases prints a line or two a phase.
func printPhases(w io.Writer, topic string, phases []tricklePhase) {
	for _, p := range phases {
		l := p.Lateness
		fmt.Fprintf(w, "%s, %s: %d tasks, lost %d, early %d; lateness ms p50 %d p99 %d max %d (after due, p99: publish began %d, confirmed %d, delivered %d)\n",
			topic, p.Name, p.Tasks, p.Lost, p.Early, l.P50, l.P99, l.Max, p.Sent.P99, p.Published.P99, p.Delivered.P99)
		if tx := p.OrderTx; tx.Count > 0 {
			fmt.Fprintf(w, "%s, %s: %d order transactions, ms p50 %.1f p99 %.1f max %.1f\n",
				topic, p.Name, tx.Count, float64(tx.P50)/1000, float64(tx.P99)/1000, float64(tx.Max)/1000)
		}
	}
}
