package integration

// The fault suite: tasks flow through both brokers at once, each pipeline
// made of the order service (this test, scheduling orders and their
// timeout tasks), the daemon (`delaybridge run`: relay and scanner, a
// process of its own) and a consumer process running outbox.Handle plus a
// conditional update. Faults are injected one at a time, then combined;
// afterwards every task must have been handled, none twice in effect, none
// early.
//
// `make test` runs the short version (each fault once). `make chaos` runs
// the long one: DELAYBRIDGE_CHAOS_TASKS tasks (at least 200,000) with the
// fault plan repeated until they are all scheduled, and writes the result
// table to DELAYBRIDGE_FAULT_REPORT.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// proc is one process of a pipeline the test can kill and start again.
type proc struct {
	name string
	bin  string
	args []string
	env  []string
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// exits counts exits the test did not cause.
	exits atomic.Int64
}

func (p *proc) start(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "---- start %s\n", time.Now().Format("15:04:05.000"))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = f, f
	// Die with the test rather than outlive it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		t.Fatalf("start %s: %v", p.name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(f, "---- exit %s: %v\n", time.Now().Format("15:04:05.000"), err)
		_ = f.Close()
		p.mu.Lock()
		if p.cmd == cmd { // not killed by the test
			p.exits.Add(1)
			p.cmd = nil
		}
		p.mu.Unlock()
		close(done)
	}()
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		t.Errorf("%s was not running when the test came to kill it (see %s)", p.name, p.log)
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// stop ends the process with SIGTERM at the end of the test.
func (p *proc) stop() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(40 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
}

func (p *proc) tail(n int) string {
	raw, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// pipeline is one broker's order flow: its own scratch database, proxies
// in front of the database and (RabbitMQ) the broker, and the two
// processes.
type pipeline struct {
	name      string
	cfg       pipelineConfig
	db        *sql.DB // the order service's own connection, no proxy
	dbProxy   *testenv.Proxy
	amqpProxy *testenv.Proxy // nil for RocketMQ
	relay     *proc
	consumer  *proc

	next        atomic.Int64 // next order number
	scheduled   atomic.Int64
	retries     atomic.Int64 // order transactions the service had to retry
	paid        atomic.Int64 // payments that went through
	rescheduled atomic.Int64 // timeouts moved
	lateToPay   atomic.Int64 // payments the timeout beat
	business    sync.WaitGroup
}

func newPipeline(t *testing.T, kind, bin, logDir string) *pipeline {
	t.Helper()
	db, dsn := testenv.ScratchDB(t)
	ctx := context.Background()
	if _, err := outbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE TABLE fault_order (id VARCHAR(32) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL) ENGINE = InnoDB",
		"CREATE TABLE fault_effect (id BIGINT AUTO_INCREMENT PRIMARY KEY, task_key VARCHAR(32) NOT NULL, handled_ms BIGINT NOT NULL, KEY (task_key)) ENGINE = InnoDB",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := &pipeline{name: kind, db: db, dbProxy: testenv.NewProxy(t, mc.Addr)}
	mc.Addr = p.dbProxy.Addr()
	mc.Timeout = 5 * time.Second
	p.cfg = pipelineConfig{Broker: kind, DSN: mc.FormatDSN(), Topic: testenv.Name("fault_" + kind)}

	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DELAYBRIDGE_") {
			env = append(env, kv) // the processes get their settings from flags only
		}
	}
	args := []string{"run", "--mysql-dsn", p.cfg.DSN, "--http", "127.0.0.1:0", "--grace", "10s", "--no-cleaner",
		"--relay-workers", "2", "--log-level", "warn"}
	switch kind {
	case "rabbit":
		url := testenv.AMQP(t)
		host := strings.SplitN(strings.SplitN(url, "@", 2)[1], "/", 2)[0]
		p.amqpProxy = testenv.NewProxy(t, host)
		p.cfg.AMQPURL = strings.Replace(url, host, p.amqpProxy.Addr(), 1)
		p.cfg.Prefix = testenv.Name("fault")
		t.Cleanup(func() { testenv.DeleteRabbitPrefix(t, url, p.cfg.Prefix) })
		args = append(args, "--broker", "rabbit", "--amqp-url", p.cfg.AMQPURL, "--rabbit-prefix", p.cfg.Prefix,
			"--rabbit-unit", faultRabbitUnit.String(), "--rabbit-depth", strconv.Itoa(faultRabbitDepth))
	case "rocket":
		p.cfg.Namesrv = testenv.RocketMQ(t)
		p.cfg.Group = testenv.Name("fault")
		ns := strings.Split(p.cfg.Namesrv, ",")
		createRocketTopic(t, ns, testenv.RocketBrokerAddr(), p.cfg.Topic)
		createRocketTopic(t, ns, testenv.RocketBrokerAddr(), broker.DefaultDeadTopic)
		args = append(args, "--broker", "rocket", "--rocketmq-namesrv", p.cfg.Namesrv, "--rocketmq-group-prefix", p.cfg.Group,
			"--rocketmq-max-delay", faultRocketHop.String(), "--rocketmq-precision", faultRocketPrec.String())
	}
	p.relay = &proc{name: kind + " relay", bin: bin, args: args, env: env, log: filepath.Join(logDir, kind+"-relay.log")}
	raw, err := json.Marshal(p.cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.consumer = &proc{name: kind + " consumer", bin: os.Args[0], args: []string{"-test.run=^$"},
		env: append(slices.Clone(env), faultRoleEnv+"=consumer", faultConfigEnv+"="+string(raw)),
		log: filepath.Join(logDir, kind+"-consumer.log")}
	t.Cleanup(func() {
		p.relay.stop()
		p.consumer.stop()
		if t.Failed() {
			t.Logf("%s, last lines:\n%s", p.relay.log, p.relay.tail(25))
			t.Logf("%s, last lines:\n%s", p.consumer.log, p.consumer.tail(25))
		}
	})
	return p
}

// order is the order service: an unpaid order and its timeout task in one
// transaction, retried until it commits. A retry after a commit whose
// answer was lost finds the order there and stops.
func (p *pipeline) order(ctx context.Context, n int64) {
	id := fmt.Sprintf("o%08d", n)
	delay := time.Second + time.Duration(n*7919%9000)*time.Millisecond // 1-10s: some tasks hop
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			p.retries.Add(1)
			time.Sleep(200 * time.Millisecond)
		}
		err := func() error {
			tx, err := p.db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck // a no-op after Commit
			if _, err := tx.ExecContext(ctx, "INSERT INTO fault_order (id, status) VALUES (?, 'UNPAID')", id); err != nil {
				return err
			}
			if _, err := outbox.Schedule(ctx, tx, outbox.Task{Topic: p.cfg.Topic, Key: id, DueAt: time.Now().Add(delay)}); err != nil {
				return err
			}
			return tx.Commit()
		}()
		var me *mysql.MySQLError
		if err == nil || (errors.As(err, &me) && me.Number == 1062) {
			p.scheduled.Add(1)
			break
		}
	}
	// The rest of the order's life runs while the faults happen: one order
	// in four is paid around its due time, racing the timeout; one in four
	// has its timeout moved once, shortly after it was scheduled.
	switch n % 4 {
	case 1:
		p.afterward(ctx, delay+time.Duration(n%11-5)*100*time.Millisecond, func() error { return p.pay(ctx, id) })
	case 2:
		p.afterward(ctx, 300*time.Millisecond, func() error { return p.moveTimeout(ctx, id, delay) })
	}
}

// afterward runs f after d on a goroutine of its own, retrying it while it
// fails (a fault is under way) and the test still runs.
func (p *pipeline) afterward(ctx context.Context, d time.Duration, f func() error) {
	p.business.Add(1)
	go func() {
		defer p.business.Done()
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		for ctx.Err() == nil && f() != nil {
			p.retries.Add(1)
			time.Sleep(200 * time.Millisecond)
		}
	}()
}

// pay is the payment: cancel the timeout task, then mark the order paid,
// in one transaction. The timeout winning (ErrFinished) ends it; a retry
// after a commit whose answer was lost finds the order paid and stops.
func (p *pipeline) pay(ctx context.Context, id string) error {
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := outbox.Cancel(ctx, tx, p.cfg.Topic, id); errors.Is(err, outbox.ErrFinished) {
		p.lateToPay.Add(1)
		return nil
	} else if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE fault_order SET status = 'PAID' WHERE id = ? AND status = 'UNPAID'", id); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	p.paid.Add(1)
	return nil
}

// moveTimeout reschedules the order's timeout to a new time up to twice as
// far: the messages already on their way for the old time must be skipped.
func (p *pipeline) moveTimeout(ctx context.Context, id string, delay time.Duration) error {
	err := outbox.Reschedule(ctx, p.db, p.cfg.Topic, id, time.Now().Add(delay/2+time.Second))
	if errors.Is(err, outbox.ErrFinished) {
		return nil
	}
	if err == nil {
		p.rescheduled.Add(1)
	}
	return err
}

// produce schedules orders at rate per second until ctx ends or limit
// orders were scheduled.
func (p *pipeline) produce(ctx context.Context, rate float64, limit int64) {
	start := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				n := p.next.Add(1) - 1
				if n >= limit {
					return
				}
				if d := time.Until(start.Add(time.Duration(float64(n) / rate * float64(time.Second)))); d > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(d):
					}
				}
				p.order(ctx, n)
			}
		}()
	}
	wg.Wait()
}

// fault is one injection. do returns when the fault is over and the
// services it touched answer again.
type fault struct {
	name string
	do   func(t *testing.T, ps []*pipeline)
}

func each(ps []*pipeline, f func(p *pipeline)) {
	for _, p := range ps {
		f(p)
	}
}

func killRelays(t *testing.T, ps []*pipeline) {
	each(ps, func(p *pipeline) { p.relay.kill(t) })
}
func killConsumers(t *testing.T, ps []*pipeline) {
	each(ps, func(p *pipeline) { p.consumer.kill(t) })
}
func startRelays(t *testing.T, ps []*pipeline) {
	each(ps, func(p *pipeline) { p.relay.start(t) })
}
func startConsumers(t *testing.T, ps []*pipeline) {
	each(ps, func(p *pipeline) { p.consumer.start(t) })
}

func faultPlan(chaos bool) []fault {
	const cut = 5 * time.Second
	plan := []fault{
		{"relay SIGKILL + restart", func(t *testing.T, ps []*pipeline) {
			killRelays(t, ps)
			time.Sleep(time.Second)
			startRelays(t, ps)
		}},
		{"consumer SIGKILL mid-handler + restart", func(t *testing.T, ps []*pipeline) {
			killConsumers(t, ps)
			time.Sleep(time.Second)
			startConsumers(t, ps)
		}},
		{"database network cut 5s", func(t *testing.T, ps []*pipeline) {
			each(ps, func(p *pipeline) { p.dbProxy.Cut() })
			time.Sleep(cut)
			each(ps, func(p *pipeline) { p.dbProxy.Restore() })
		}},
		{"RabbitMQ network cut 5s", func(t *testing.T, ps []*pipeline) {
			each(ps, func(p *pipeline) {
				if p.amqpProxy != nil {
					p.amqpProxy.Cut()
				}
			})
			time.Sleep(cut)
			each(ps, func(p *pipeline) {
				if p.amqpProxy != nil {
					p.amqpProxy.Restore()
				}
			})
		}},
		{"RabbitMQ memory alarm 5s", func(t *testing.T, _ []*pipeline) { testenv.RabbitMemoryAlarm(t, cut) }},
		{"RabbitMQ stop_app/start_app", func(t *testing.T, _ []*pipeline) { testenv.RabbitStopApp(t, 3*time.Second) }},
		{"RabbitMQ node restart", func(t *testing.T, _ []*pipeline) { testenv.RabbitRestartNode(t) }},
		{"RocketMQ broker SIGKILL + restart", func(t *testing.T, _ []*pipeline) { testenv.RocketKillBroker(t) }},
		{"MariaDB restart", func(t *testing.T, _ []*pipeline) { testenv.MariaDBRestart(t) }},
	}
	if chaos {
		plan = append(plan, fault{"MariaDB SIGKILL (mysqld_safe restarts it)", func(t *testing.T, _ []*pipeline) { testenv.MariaDBKill(t) }})
	}
	return append(plan, fault{"combined: relay + consumer SIGKILL, database cut, RabbitMQ stop_app", func(t *testing.T, ps []*pipeline) {
		killRelays(t, ps)
		killConsumers(t, ps)
		each(ps, func(p *pipeline) { p.dbProxy.Cut() })
		testenv.RabbitStopApp(t, cut)
		each(ps, func(p *pipeline) { p.dbProxy.Restore() })
		startRelays(t, ps)
		startConsumers(t, ps)
	}})
}

// injected is one fault as it happened.
type injected struct {
	name       string
	start, end time.Time
}

func TestFaults_EveryTaskHandledOnceNeverEarly(t *testing.T) {
	testenv.SkipIfShort(t, "the fault suite restarts the services")
	chaosTasks, _ := strconv.Atoi(os.Getenv("DELAYBRIDGE_CHAOS_TASKS"))
	chaos := chaosTasks > 0
	rate, settle := 30.0, 3*time.Second // per pipeline
	if chaos {
		rate, settle = 150, 5*time.Second
		if r, err := strconv.ParseFloat(os.Getenv("DELAYBRIDGE_CHAOS_RATE"), 64); err == nil && r > 0 {
			rate = r
		}
	}
	testenv.MySQL(t)
	testenv.AMQP(t)
	testenv.RocketMQ(t)

	dir := t.TempDir()
	bin := buildDelaybridge(t)
	logDir := os.Getenv("DELAYBRIDGE_FAULT_LOGS")
	if logDir == "" {
		logDir = dir
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ps := []*pipeline{newPipeline(t, "rabbit", bin, logDir), newPipeline(t, "rocket", bin, logDir)}
	startRelays(t, ps)
	startConsumers(t, ps)

	// Schedule while the faults happen: the short run until the plan is
	// done, the chaos run until every task is scheduled (the plan repeats).
	limit := int64(1 << 62)
	if chaos {
		limit = int64((chaosTasks + len(ps) - 1) / len(ps))
	}
	ctx, stopProducing := context.WithCancel(context.Background())
	defer stopProducing()
	var producing sync.WaitGroup
	for _, p := range ps {
		producing.Add(1)
		go func() { defer producing.Done(); p.produce(ctx, rate, limit) }()
	}
	var faults []injected
	plan := faultPlan(chaos)
	time.Sleep(settle)
	for round := 1; ; round++ {
		for _, f := range plan {
			start := time.Now()
			t.Logf("round %d: %s", round, f.name)
			f.do(t, ps)
			faults = append(faults, injected{name: f.name, start: start, end: time.Now()})
			if t.Failed() {
				t.FailNow()
			}
			each(ps, func(p *pipeline) {
				if n := p.relay.exits.Load() + p.consumer.exits.Load(); n > 0 {
					t.Fatalf("%s: a process exited on its own after %q (see %s, %s)", p.name, f.name, p.relay.log, p.consumer.log)
				}
			})
			time.Sleep(settle)
		}
		if !chaos || allScheduled(ps, limit) {
			break
		}
	}
	stopProducing()
	producing.Wait()
	each(ps, func(p *pipeline) { p.business.Wait() })
	t.Logf("scheduling done: %v", scheduledCounts(ps))

	// Every task is due within 10s of its scheduling; give the scanner its
	// grace and the pipelines time to drain.
	drain := 3 * time.Minute
	if chaos {
		drain = 15 * time.Minute
	}
	deadline := time.Now().Add(drain)
	for _, p := range ps {
		var open int
		if !testutil.Eventually(time.Until(deadline), 2*time.Second, func() bool {
			// Handle marks a task done in the transaction of its effect.
			if err := p.db.QueryRow(`SELECT COUNT(*) FROM delay_task WHERE state IN ('pending', 'published')`).Scan(&open); err != nil {
				t.Fatal(err)
			}
			return open == 0
		}) {
			t.Errorf("%s: %d tasks never handled", p.name, open)
		}
	}

	var rows []faultRow
	for _, p := range ps {
		rows = append(rows, p.verify(t, faults))
	}
	report := faultReport(rows, faults)
	t.Log("\n" + report)
	if path := os.Getenv("DELAYBRIDGE_FAULT_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
			t.Error(err)
		}
	}
}

func allScheduled(ps []*pipeline, limit int64) bool {
	for _, p := range ps {
		if p.scheduled.Load() < limit {
			return false
		}
	}
	return true
}

func scheduledCounts(ps []*pipeline) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%s %d (paid %d, the timeout first %d, rescheduled %d; transactions retried %d)",
			p.name, p.scheduled.Load(), p.paid.Load(), p.lateToPay.Load(), p.rescheduled.Load(), p.retries.Load()))
	}
	return strings.Join(parts, ", ")
}

// faultRow is one pipeline's outcome.
type faultRow struct {
	broker                  string
	tasks, lost, dup, early int
	notDone, notCancelled   int
	paidHandled, paid       int
	p99, maxLate            time.Duration
	recovery                []time.Duration // per injected fault
}

// verify reads the pipeline's database and asserts the promise: every
// unpaid order's task handled, each effect once, none before its (latest)
// due time, every paid order's task cancelled and never handled, and every
// order either paid or cancelled.
func (p *pipeline) verify(t *testing.T, faults []injected) faultRow {
	t.Helper()
	r := faultRow{broker: p.name}
	q := func(dst *int, query string) {
		if err := p.db.QueryRow(query).Scan(dst); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
	}
	q(&r.tasks, "SELECT COUNT(*) FROM fault_order")
	q(&r.paid, "SELECT COUNT(*) FROM fault_order WHERE status = 'PAID'")
	q(&r.lost, "SELECT COUNT(*) FROM fault_order o WHERE o.status <> 'PAID' AND NOT EXISTS (SELECT 1 FROM fault_effect e WHERE e.task_key = o.id)")
	q(&r.paidHandled, "SELECT COUNT(*) FROM fault_order o WHERE o.status = 'PAID' AND EXISTS (SELECT 1 FROM fault_effect e WHERE e.task_key = o.id)")
	q(&r.dup, "SELECT COUNT(*) FROM (SELECT task_key FROM fault_effect GROUP BY task_key HAVING COUNT(*) > 1) d")
	q(&r.early, "SELECT COUNT(*) FROM fault_effect e JOIN delay_task d ON d.task_key = e.task_key WHERE e.handled_ms < d.due_ms")
	q(&r.notDone, `SELECT COUNT(*) FROM delay_task d JOIN fault_order o ON o.id = d.task_key
WHERE d.state <> IF(o.status = 'PAID', 'cancelled', 'done')`)
	q(&r.notCancelled, "SELECT COUNT(*) FROM fault_order WHERE status NOT IN ('CANCELLED', 'PAID')")

	rows, err := p.db.Query("SELECT d.due_ms, MIN(e.handled_ms) FROM delay_task d JOIN fault_effect e ON e.task_key = d.task_key GROUP BY d.id ORDER BY d.due_ms")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var dues, lates []int64
	var prefixMax []int64 // latest first handling of any task due up to here
	for rows.Next() {
		var due, handled int64
		if err := rows.Scan(&due, &handled); err != nil {
			t.Fatal(err)
		}
		dues = append(dues, due)
		lates = append(lates, handled-due)
		if n := len(prefixMax); n > 0 {
			prefixMax = append(prefixMax, max(prefixMax[n-1], handled))
		} else {
			prefixMax = append(prefixMax, handled)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sorted := slices.Clone(lates)
	slices.Sort(sorted)
	if len(sorted) > 0 {
		r.p99 = time.Duration(sorted[len(sorted)*99/100]) * time.Millisecond
		r.maxLate = time.Duration(sorted[len(sorted)-1]) * time.Millisecond
	}
	// Recovery: from the end of a fault until every task due by then had
	// been handled.
	for _, f := range faults {
		end := f.end.UnixMilli()
		i, _ := slices.BinarySearch(dues, end+1)
		var rec time.Duration
		if i > 0 && prefixMax[i-1] > end {
			rec = time.Duration(prefixMax[i-1]-end) * time.Millisecond
		}
		r.recovery = append(r.recovery, rec)
	}

	if r.tasks == 0 {
		t.Errorf("%s: no task was scheduled", p.name)
	}
	if r.paid == 0 {
		t.Errorf("%s: no payment went through: the pay race was not exercised", p.name)
	}
	if r.lost != 0 || r.dup != 0 || r.early != 0 || r.notDone != 0 || r.notCancelled != 0 || r.paidHandled != 0 {
		t.Errorf("%s: %d tasks: lost %d, duplicate effects %d, early %d, task state contradicting its order %d, orders neither paid nor cancelled %d, paid orders handled %d",
			p.name, r.tasks, r.lost, r.dup, r.early, r.notDone, r.notCancelled, r.paidHandled)
	}
	return r
}

func faultReport(rows []faultRow, faults []injected) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| broker | tasks | paid | faults | lost | duplicate effects | early | paid but handled | p99 lateness | max lateness |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %v | %v |\n", r.broker, r.tasks, r.paid, len(faults), r.lost, r.dup, r.early, r.paidHandled,
			r.p99.Round(time.Millisecond), r.maxLate.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "\n| fault | lasted |")
	for _, r := range rows {
		fmt.Fprintf(&b, " %s recovered after |", r.broker)
	}
	fmt.Fprintf(&b, "\n|---|---|%s\n", strings.Repeat("---|", len(rows)))
	for i, f := range faults {
		fmt.Fprintf(&b, "| %s | %v |", f.name, f.end.Sub(f.start).Round(100*time.Millisecond))
		for _, r := range rows {
			fmt.Fprintf(&b, " %v |", r.recovery[i].Round(100*time.Millisecond))
		}
		b.WriteString("\n")
	}
	return b.String()
}
