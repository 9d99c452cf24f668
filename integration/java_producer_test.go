package integration

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// javaProducer builds examples/java-producer (its driver from Maven Central
// through mvn, the class with javac) and returns a function that runs it
// against the database of dsn.
func javaProducer(t *testing.T, dsn string) func(args ...string) string {
	t.Helper()
	for _, tool := range []string{"mvn", "javac", "java"} {
		if _, err := exec.LookPath(tool); err != nil {
			// scripts/services.sh installs Maven and Java 17 for the local RocketMQ.
			testenv.Unreachable(t, tool, "PATH", err)
		}
	}
	src, err := filepath.Abs("../examples/java-producer")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	lib, classes := filepath.Join(tmp, "lib"), filepath.Join(tmp, "classes")
	command := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(name, args...)
		cmd.Dir = src
		return cmd
	}
	// Offline first, from the local repository: it saves the network round
	// trips; online on a fresh box, where the driver is not there yet.
	mvn := []string{"-q", "-B", "-Dstyle.color=never", "dependency:copy-dependencies", "-DincludeScope=runtime", "-DoutputDirectory=" + lib}
	start := time.Now()
	if _, err := command("mvn", append([]string{"-o"}, mvn...)...).CombinedOutput(); err != nil {
		if out, err := command("mvn", mvn...).CombinedOutput(); err != nil {
			t.Fatalf("mvn: %v\n%s", err, out)
		}
	}
	if out, err := command("javac", "-d", classes, "-cp", filepath.Join(lib, "*"),
		"src/main/java/io/github/delaybridge/example/OrderProducer.java").CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}
	t.Logf("mvn and javac took %v", time.Since(start).Round(time.Millisecond))
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(),
		"DELAYBRIDGE_JDBC_URL=jdbc:mariadb://"+cfg.Addr+"/"+cfg.DBName,
		"DELAYBRIDGE_JDBC_USER="+cfg.User,
		"DELAYBRIDGE_JDBC_PASSWORD="+cfg.Passwd)
	return func(args ...string) string {
		t.Helper()
		cmd := command("java", append([]string{"-cp", classes + string(os.PathListSeparator) + filepath.Join(lib, "*"),
			"io.github.delaybridge.example.OrderProducer"}, args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("java OrderProducer %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
}

// TestJavaProducer_TasksInsertedByJDBCAreRelayedAndHandledByTheGoConsumer
// runs the Java producer of examples/java-producer: it creates ten orders,
// each with its timeout task in the same JDBC transaction, and pays three,
// cancelling their tasks. The Go relay and consumer on the real RabbitMQ
// then cancel exactly the seven unpaid orders, once each.
func TestJavaProducer_TasksInsertedByJDBCAreRelayedAndHandledByTheGoConsumer(t *testing.T) {
	skipIfShort(t)
	db, dsn := testenv.ScratchDB(t)
	if _, err := outbox.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	java := javaProducer(t, dsn)
	if out := java("create", "jp", "10", "300"); strings.Count(out, "created jp-") != 10 {
		t.Fatalf("create printed %q", out)
	}
	if out := java("pay", "jp-0", "jp-3", "jp-6"); strings.Count(out, "paid jp-") != 3 {
		t.Fatalf("pay printed %q", out)
	}
	var pending, cancelled int
	if err := db.QueryRow("SELECT SUM(state = 'pending'), SUM(state = 'cancelled') FROM delay_task").Scan(&pending, &cancelled); err != nil || pending != 7 || cancelled != 3 {
		t.Fatalf("after the Java producer: %d pending, %d cancelled tasks (%v); want 7 and 3", pending, cancelled, err)
	}

	// Each committed cancellation counts itself here, in the handler's
	// transaction: "once each" is about what committed, not how often the
	// handler ran.
	if _, err := db.Exec("CREATE TABLE java_effects (id VARCHAR(64) PRIMARY KEY, n INT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	// The two minutes are for the Go relay and consumer, so they start
	// here: on a loaded box, mvn, javac and the JVM starts above can take
	// most of them.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pub, sub := rabbitClients(t, rabbitConfig(t))
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{IdleMax: 50 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = relay.Run(ctx) }()
	var mu sync.Mutex
	var seen []*broker.Message
	c, err := outbox.NewConsumer(db, sub, pub, func(ctx context.Context, tx *sql.Tx, m *broker.Message) error {
		mu.Lock()
		seen = append(seen, m)
		mu.Unlock()
		if _, err := tx.ExecContext(ctx, "INSERT INTO java_effects (id, n) VALUES (?, 1) ON DUPLICATE KEY UPDATE n = n + 1", m.Key); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "UPDATE java_orders SET status = 'CANCELLED' WHERE id = ? AND status = 'UNPAID'", m.Key)
		return err
	}, broker.ConsumerConfig{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, "order-cancel"); err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background()) //nolint:errcheck

	for {
		var done int
		if err := db.QueryRow("SELECT COUNT(*) FROM delay_task WHERE state = 'done'").Scan(&done); err != nil {
			t.Fatal(err)
		}
		if done == 7 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("only %d of 7 tasks done", done)
		case <-time.After(50 * time.Millisecond):
		}
	}
	statuses := queryMap[string](t, db, "SELECT id, status FROM java_orders")
	for i := range 10 {
		id, want := fmt.Sprintf("jp-%d", i), "CANCELLED"
		if i%3 == 0 && i < 9 {
			want = "PAID"
		}
		if statuses[id] != want {
			t.Errorf("order %s is %q, want %s", id, statuses[id], want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	handled := map[string]int{}
	for _, m := range seen {
		handled[m.Key]++
		if m.Headers["producer"] != "java" || string(m.Payload) != `{"order":"`+m.Key+`"}` || m.Generation != 0 {
			t.Errorf("message %s: headers %v, payload %q, generation %d", m.Key, m.Headers, m.Payload, m.Generation)
		}
	}
	if len(handled) != 7 {
		t.Fatalf("the handler ran for %d orders, want 7: %v", len(handled), handled)
	}
	effects := queryMap[int](t, db, "SELECT id, n FROM java_effects")
	for i := range 10 {
		id, want := fmt.Sprintf("jp-%d", i), 1
		if i%3 == 0 && i < 9 {
			want = 0 // paid: its task was cancelled, nothing runs
		}
		if effects[id] != want {
			t.Errorf("order %s: the cancellation committed %d times, want %d", id, effects[id], want)
		}
	}
}

// queryMap runs query, whose rows are (id, value), and returns them by id.
func queryMap[V any](t *testing.T, db *sql.DB, query string) map[string]V {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]V{}
	for rows.Next() {
		var id string
		var v V
		if err := rows.Scan(&id, &v); err != nil {
			t.Fatal(err)
		}
		out[id] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
