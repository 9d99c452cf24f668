package console

import (
	"fmt"
	"github.com/delaybridge/delaybridge/internal/driver"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// BenchmarkConsole loads DELAYBRIDGE_BENCH_CONSOLE_ROWS tasks into a
// scratch database (dropped afterwards) over 20 topics: 55% published and
// 5% pending, due over the next 7 days; 39% done and 1% dead, due over the
// last 7 days (the default retention). It then measures what a browser
// waits for: one GET of the overview, of a search page and of the dead
// list, through the console's whole handler (auth, queries, templates). It
// is skipped without that variable: loading a million rows takes minutes.
func BenchmarkConsole(b *testing.B) {
	n, _ := strconv.Atoi(os.Getenv("DELAYBRIDGE_BENCH_CONSOLE_ROWS"))
	if n <= 0 {
		b.Skip("set DELAYBRIDGE_BENCH_CONSOLE_ROWS to the rows to load")
	}
	db, dsn := testenv.ScratchDB(b)
	ctx := b.Context()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		b.Fatal(err)
	}
	const week = int64(7 * 24 * time.Hour / time.Millisecond)
	now := time.Now().UnixMilli()
	start := time.Now()
	// MariaDB's SEQUENCE engine makes the rows server-side, in chunks that
	// keep each transaction moderate. seq % 100 picks the state.
	const chunk = 200_000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(n, lo+chunk-1)
		if _, err := db.ExecContext(ctx, `INSERT INTO delay_task (topic, task_key, due_ms, payload, state, created_ms, updated_ms, published_ms, done_ms, last_error)
SELECT CONCAT('topic-', seq % 20), CONCAT('key-', seq),
  IF(seq % 100 < 60, ? + seq * ? DIV ?, ? - seq * ? DIV ?), REPEAT('x', 100),
  CASE WHEN seq % 100 < 55 THEN 'published' WHEN seq % 100 < 60 THEN 'pending' WHEN seq % 100 < 99 THEN 'done' ELSE 'dead' END,
  ?, ?, IF(seq % 100 < 55 OR seq % 100 BETWEEN 60 AND 98, ?, 0),
  IF(seq % 100 BETWEEN 60 AND 98, ? - seq * ? DIV ? + 20 + seq % 400, 0),
  IF(seq % 100 = 99, 'handler gave up after 10 attempts', NULL)
FROM seq_`+strconv.Itoa(lo)+`_to_`+strconv.Itoa(hi),
			now, week, n, now, week, n, now, now, now, now, week, n); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("loaded %d rows in %v", n, time.Since(start).Round(time.Second))
	if _, err := db.ExecContext(ctx, "ANALYZE TABLE delay_task"); err != nil {
		b.Fatal(err)
	}
	if err := outbox.RefreshStats(ctx, db, 30*time.Second); err != nil {
		b.Fatal(err)
	}

	env := testEnv(b, dsn, io.Discard)
	env.Broker = driver.Settings{Broker: "rabbit"}
	c, err := newConsole(env, []*Shard{{dsn: dsn, db: db}}, credential{user: "ops", password: testConsolePassword}, Options{grace: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	b.Cleanup(func() { srv.Close(); c.Close() })
	dead := n / 100
	for _, page := range []struct{ name, path, want string }{
		{"overview", "/", fmt.Sprintf(`id="dead-count">%d<`, dead)},
		{"search-topic-state", "/tasks?topic=topic-7&state=published", `class="task"`},
		{"search-due-window", "/tasks?from=%2B1h&to=%2B2h", `class="task"`},
		{"dead", "/dead", `class="task"`},
	} {
		b.Run(page.name, func(b *testing.B) {
			for b.Loop() {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+page.path, nil)
				if err != nil {
					b.Fatal(err)
				}
				req.SetBasicAuth("ops", testConsolePassword)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), page.want) {
					b.Fatalf("GET %s: %d, body lacks %q", page.path, resp.StatusCode, page.want)
				}
			}
		})
	}
}
