package integration

// A sharded order database: each shard keeps its own outbox, served by a
// daemon of its own (`delaybridge run --shard-name`, docs/deployment.md);
// one consumer handles every shard's tasks, each in its own shard. The
// second shard is a MariaDB server of its own (scripts/cluster.sh shard),
// started for this test only.

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// shardGrace is the shard daemons' scanner grace: how long past its due
// time a task may stay not done before it is published again.
const shardGrace = 5 * time.Second

// orderShard is one shard of the order database and its daemon.
type orderShard struct {
	name   string
	db     *sql.DB
	dsn    string
	http   string
	daemon *proc

	mu        sync.Mutex
	committed []string // keys whose order transaction committed
	refused   atomic.Int64
}

func newOrderShard(t *testing.T, name, serverDSN, bin string, rc rabbit.Config) *orderShard {
	t.Helper()
	db, dsn := testenv.ScratchDBAt(t, serverDSN)
	if _, err := outbox.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL,
  effects INT NOT NULL DEFAULT 0) ENGINE = InnoDB`); err != nil {
		t.Fatal(err)
	}
	// A dead shard refuses connections at once; a short timeout only
	// bounds a half-open one.
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	mc.Timeout = 2 * time.Second
	db.SetConnMaxLifetime(0)
	s := &orderShard{name: name, db: db, dsn: mc.FormatDSN(), http: testenv.FreeAddr(t)}
	s.daemon = &proc{name: "shard " + name + " daemon", bin: bin, env: flagsOnlyEnv(), log: filepath.Join(t.TempDir(), "run-"+name+".log"),
		args: []string{"run", "--shard-name", name, "--mysql-dsn", s.dsn, "--http", s.http, "--grace", shardGrace.String(), "--no-cleaner",
			"--relay-workers", "2", "--stats-interval", "1s", "--log-level", "warn",
			"--broker", "rabbit", "--amqp-url", rc.URL, "--rabbit-prefix", rc.Prefix,
			"--rabbit-unit", rc.Unit.String(), "--rabbit-depth", strconv.Itoa(rc.Depth)}}
	t.Cleanup(func() {
		s.daemon.stop()
		if t.Failed() {
			t.Logf("%s, last lines:\n%s", s.daemon.log, s.daemon.tail(25))
		}
	})
	return s
}

// flagsOnlyEnv is this process's environment without DELAYBRIDGE_*
// settings, for a delaybridge process that gets them from flags only.
func flagsOnlyEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DELAYBRIDGE_") {
			env = append(env, kv)
		}
	}
	return env
}

// produce writes an order and its timeout task, due in 1-3 s, every 20 ms
// until ctx ends; a refused transaction (the shard is down) is counted, not
// retried: the order never existed.
func (s *orderShard) produce(ctx context.Context, topic string) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		key := fmt.Sprintf("%s-%06d", s.name, n)
		due := time.Now().Add(time.Second + time.Duration(n*7919%2000)*time.Millisecond)
		err := func() error {
			tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			tx, err := s.db.BeginTx(tctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck
			if _, err := tx.ExecContext(tctx, "INSERT INTO orders (id, status) VALUES (?, 'UNPAID')", key); err != nil {
				return err
			}
			if _, err := outbox.Schedule(tctx, tx, outbox.Task{Topic: topic, Key: key, DueAt: due}); err != nil {
				return err
			}
			return tx.Commit()
		}()
		if err != nil {
			s.refused.Add(1)
			continue
		}
		s.mu.Lock()
		s.committed = append(s.committed, key)
		s.mu.Unlock()
	}
}

// waitReady waits until the shard's daemon answers /readyz with 200. It
// serves HTTP only once its relay and scanner run, so a slow start on a
// loaded box is not mistaken for a shard that does not flow.
func (s *orderShard) waitReady(t *testing.T, wait time.Duration) {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	last := "no answer"
	if !testutil.Eventually(wait, 100*time.Millisecond, func() bool {
		resp, err := c.Get("http://" + s.http + "/readyz")
		if err != nil {
			last = err.Error()
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatalf("shard %s's daemon not ready after %v: /readyz %s (daemon log %s)", s.name, wait, last, s.daemon.log)
	}
}

func (s *orderShard) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := s.db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("shard %s: %v", s.name, err)
	}
	return n
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// buildDelaybridge builds the binary into a temporary directory.
func buildDelaybridge(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "delaybridge")
	build := exec.Command("go", "build", "-o", bin, "./cmd/delaybridge")
	build.Dir = testenv.ModuleRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func TestShards_ADeadShardStallsOnlyItselfAndLosesNothing(t *testing.T) {
	testenv.SkipIfShort(t, "starts and kills a second MariaDB server")
	testenv.MySQL(t)
	rc := rabbitConfig(t)
	rc.Unit, rc.Depth = faultRabbitUnit, faultRabbitDepth
	shard2 := testenv.Shard2(t)
	bin := buildDelaybridge(t)
	topic := testenv.Name("shard")
	shards := []*orderShard{newOrderShard(t, "a", testenv.MySQLDSN(), bin, rc), newOrderShard(t, "b", shard2, bin, rc)}
	a, b := shards[0], shards[1]
	for _, s := range shards {
		s.daemon.start(t)
	}
	for _, s := range shards {
		s.waitReady(t, 30*time.Second)
	}

	// One consumer for every shard: the key says which shard holds the
	// task, as the order service's own sharding function would.
	var early atomic.Int64
	handler := func(ctx context.Context, m *broker.Message) error {
		if time.Now().Before(m.DeliverAt) {
			early.Add(1)
		}
		s := a
		if strings.HasPrefix(m.Key, "b-") {
			s = b
		}
		_, err := outbox.Handle(ctx, s.db, m, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'CANCELLED', effects = effects + 1 WHERE id = ? AND status = 'UNPAID'", m.Key)
			return err
		})
		return err
	}
	pub, sub := rabbitClients(t, rc)
	c, err := broker.NewConsumer(sub, pub, handler, broker.ConsumerConfig{Logger: quiet(), Concurrency: 16,
		Backoff: broker.Backoff{Initial: 500 * time.Millisecond, Max: 4 * time.Second}, MaxAttempts: 50})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})

	ctx, stopProducing := context.WithCancel(context.Background())
	defer stopProducing()
	var producing sync.WaitGroup
	for _, s := range shards {
		producing.Add(1)
		go func() { defer producing.Done(); s.produce(ctx, topic) }()
	}
	// Both shards flow before the outage. The first tasks come due 1-3 s
	// after they are written; a loaded box may take a while longer.
	for _, s := range shards {
		if !testutil.Eventually(30*time.Second, 100*time.Millisecond, func() bool {
			return s.count(t, "SELECT COUNT(*) FROM delay_task WHERE state = 'done'") > 0
		}) {
			t.Fatalf("shard %s: no task done within 30s of producing (daemon log %s)", s.name, s.daemon.log)
		}
	}

	// Shard a kept flowing: everything of it due more than twice the
	// scanner's grace ago is done. Lateness is ~0.1 s when nothing is
	// wrong, a task the broker lost is published again after the grace,
	// and stalls of a loaded box add seconds; the slack covers those, and
	// the outage outlasts it by 5 s, so tasks of shard a that came due
	// while shard b was down are checked too.
	overdue := 2 * shardGrace
	killed := time.Now()
	testenv.Shard2Kill(t)
	time.Sleep(overdue + 5*time.Second)
	doneA := a.count(t, "SELECT COUNT(*) FROM delay_task WHERE state = 'done' AND done_ms >= ?", killed.UnixMilli())
	behind := a.count(t, "SELECT COUNT(*) FROM delay_task WHERE state <> 'done' AND due_ms < ?", time.Now().Add(-overdue).UnixMilli())
	t.Logf("while shard b was down: shard a handled %d tasks, %d of its tasks were >%v overdue", doneA, behind, overdue)
	if doneA == 0 || behind > 0 {
		t.Errorf("shard a stalled with shard b: %d handled during the outage, %d >%v overdue", doneA, behind, overdue)
	}
	if code, _ := httpGet(t, "http://"+b.http+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("shard b's daemon /readyz answered %d with its database down, want 503", code)
	}
	if code, _ := httpGet(t, "http://"+a.http+"/readyz"); code != http.StatusOK {
		t.Errorf("shard a's daemon /readyz answered %d, want 200", code)
	}
	if b.refused.Load() == 0 {
		t.Error("no order transaction on shard b failed while it was down: was it killed?")
	}

	testenv.Shard2Start(t)
	back := time.Now()
	time.Sleep(3 * time.Second)
	stopProducing()
	producing.Wait()

	// Drain: every task committed in either shard gets handled.
	deadline := time.Now().Add(2 * time.Minute)
	var recovered time.Duration
	for _, s := range shards {
		var open int
		if !testutil.Eventually(time.Until(deadline), 200*time.Millisecond, func() bool {
			open = s.count(t, "SELECT COUNT(*) FROM delay_task WHERE state <> 'done'")
			if s == b && recovered == 0 && s.count(t, "SELECT COUNT(*) FROM delay_task WHERE state <> 'done' AND due_ms < ?", back.UnixMilli()) == 0 {
				recovered = time.Since(back)
			}
			return open == 0
		}) {
			t.Fatalf("shard %s: %d tasks never handled", s.name, open)
		}
	}
	t.Logf("shard b down %v; every task of it due before its return handled %v after it came back", back.Sub(killed).Round(time.Millisecond), recovered.Round(100*time.Millisecond))

	for _, s := range shards {
		s.mu.Lock()
		committed := len(s.committed)
		keys := s.committed
		s.mu.Unlock()
		missing := 0
		for _, k := range keys {
			if s.count(t, "SELECT COUNT(*) FROM delay_task WHERE task_key = ? AND state = 'done'", k) != 1 {
				missing++
			}
		}
		tasks := s.count(t, "SELECT COUNT(*) FROM delay_task")
		once := s.count(t, "SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED' AND effects = 1")
		dups := s.count(t, "SELECT COUNT(*) FROM orders WHERE effects > 1")
		earlyRows := s.count(t, "SELECT COUNT(*) FROM delay_task WHERE done_ms < due_ms")
		t.Logf("shard %s: %d orders committed, %d refused, %d tasks, lost %d, dup_effects %d, early %d", s.name, committed, s.refused.Load(), tasks, missing, dups, earlyRows)
		if missing != 0 || dups != 0 || earlyRows != 0 || once != tasks || tasks < committed {
			t.Errorf("shard %s: lost %d, dup_effects %d, early %d, cancelled once %d of %d tasks", s.name, missing, dups, earlyRows, once, tasks)
		}
		if n := s.daemon.exits.Load(); n != 0 {
			t.Errorf("shard %s's daemon exited %d times on its own (see %s)", s.name, n, s.daemon.log)
		}
		// Its metrics carry its name.
		if _, body := httpGet(t, "http://"+s.http+"/metrics"); !strings.Contains(body, `delaybridge_relay_published_total{shard="`+s.name+`"}`) {
			t.Errorf("shard %s's /metrics lacks its shard label", s.name)
		}
	}
	if n := early.Load(); n != 0 {
		t.Errorf("%d handler runs before their due time", n)
	}

	// status reads both shards in one command, naming each.
	status := exec.Command(bin, "status", "--shard", "a="+a.dsn, "--shard", "b="+b.dsn)
	status.Env = flagsOnlyEnv()
	out, err := status.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "== shard a\n") || !strings.Contains(string(out), "== shard b\n") {
		t.Errorf("status over both shards: %v\n%s", err, out)
	}
}
