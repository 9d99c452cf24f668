package delaybridge_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/settings"
	"github.com/delaybridge/delaybridge/outbox"
	"github.com/delaybridge/delaybridge/rabbit"
	"github.com/delaybridge/delaybridge/rocket"
	"github.com/delaybridge/delaybridge/scanner"
)

// clearEnv unsets every DELAYBRIDGE_* variable for the test.
func clearEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, settings.EnvPrefix) {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

func TestLoadConfig_FlagBeatsEnvironmentBeatsFileBeatsDefault(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "delaybridge.conf")
	conf := "broker = rocket\nrabbit-prefix = from-file\nrocketmq-group-prefix = from-file\nrabbit-depth = 9\n"
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "dsn")
	if err := os.WriteFile(secret, []byte("u:p@tcp(db:3306)/x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DELAYBRIDGE_CONFIG", file)
	t.Setenv("DELAYBRIDGE_RABBIT_PREFIX", "from-env")
	t.Setenv("DELAYBRIDGE_RABBIT_DEPTH", "10")
	t.Setenv("DELAYBRIDGE_MYSQL_DSN_FILE", secret)
	cfg, err := delaybridge.LoadConfig([]string{"--rabbit-depth", "11"})
	if err != nil {
		t.Fatal(err)
	}
	want := delaybridge.DefaultConfig()
	want.Broker, want.RocketGroupPrefix = "rocket", "from-file"
	want.RabbitPrefix = "from-env"
	want.RabbitDepth = 11
	want.MySQLDSN = "u:p@tcp(db:3306)/x"
	if cfg.Broker != want.Broker || cfg.RocketGroupPrefix != want.RocketGroupPrefix || cfg.RabbitPrefix != want.RabbitPrefix ||
		cfg.RabbitDepth != want.RabbitDepth || cfg.MySQLDSN != want.MySQLDSN || cfg.RabbitUnit != want.RabbitUnit || cfg.RocketQueues != want.RocketQueues {
		t.Errorf("LoadConfig = %+v\nwant %+v", cfg, want)
	}
}

func TestLoadConfig_BadInputIsAClearError(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name, file string
		env        map[string]string
		args       []string
		want       string
	}{
		{name: "unknown flag", args: []string{"--no-such-flag"}, want: "unknown flag: --no-such-flag"},
		{name: "unknown file key", file: "mysql_dsn = x\n", want: `unknown setting "mysql_dsn"`},
		{name: "bad env value", env: map[string]string{"DELAYBRIDGE_RABBIT_DEPTH": "deep"}, want: "DELAYBRIDGE_RABBIT_DEPTH"},
		{name: "config in a config file", file: "config = /etc/other.conf\n", want: "a config file cannot name another"},
		{name: "empty prefix", args: []string{"--rabbit-prefix", ""}, want: "must not be empty"},
		{name: "empty group prefix in the file", file: "rocketmq-group-prefix =\n", want: "rocketmq-group-prefix: must not be empty"},
		{name: "secret twice", env: map[string]string{"DELAYBRIDGE_AMQP_URL": "amqp://a", "DELAYBRIDGE_AMQP_URL_FILE": filepath.Join(dir, "none")}, want: "--amqp-url and --amqp-url-file are both set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := tc.args
			if tc.file != "" {
				f := filepath.Join(t.TempDir(), "c.conf")
				if err := os.WriteFile(f, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", f)
			}
			if _, err := delaybridge.LoadConfig(args); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("LoadConfig = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestLoadFlags_ServiceFlagsAndDelaybridgeSettingsShareOneFlagSet(t *testing.T) {
	clearEnv(t)
	t.Setenv("DELAYBRIDGE_ORDERS", "7")
	t.Setenv("DELAYBRIDGE_BROKER", "rocket")
	fs := pflag.NewFlagSet("svc", pflag.ContinueOnError)
	orders := fs.Int("orders", 1, "orders to create")
	cfg := delaybridge.DefaultConfig()
	cfg.RegisterFlags(fs)
	if err := delaybridge.LoadFlags(fs, []string{"--rocketmq-mode", "levels"}, "svc"); err != nil {
		t.Fatal(err)
	}
	if *orders != 7 || cfg.Broker != "rocket" || cfg.RocketMode != "levels" {
		t.Errorf("orders %d, broker %q, mode %q", *orders, cfg.Broker, cfg.RocketMode)
	}
}

func TestNewClient_RefusesBadSettingsWithoutConnecting(t *testing.T) {
	t.Parallel()
	db := &sql.DB{}
	for _, tc := range []struct {
		cfg  delaybridge.Config
		want string
	}{
		{delaybridge.Config{Broker: "kafka"}, `--broker "kafka"`},
		{delaybridge.Config{}, "no RabbitMQ configured"},
		{delaybridge.Config{AMQPURL: "amqp://x", RabbitMode: "plugin"}, `--rabbit-mode "plugin"`},
		{delaybridge.Config{Broker: "rocket", RocketMode: "levels", RocketLevels: "1x"}, "--rocketmq-levels"},
		{delaybridge.Config{Broker: "rocket", RocketAccessKey: "ak"}, "go together"},
		{delaybridge.Config{AMQPURL: "amqp://x", RabbitDepth: -1}, "--rabbit-depth -1"},
		{delaybridge.Config{AMQPURL: "http://x"}, "not a valid AMQP URL"},
		{delaybridge.Config{Broker: "rocket", RocketGroupPrefix: "a b"}, "Config.GroupPrefix"},
		{delaybridge.Config{AMQPURL: "amqp://x", Relay: &outbox.RelayConfig{Lookahead: time.Millisecond}}, "Config.Relay: outbox: NewRelay: Lookahead 1ms"},
		{delaybridge.Config{AMQPURL: "amqp://x", Scanner: &scanner.Config{Lease: time.Second}}, "Config.Scanner: scanner: Lease 1s"},
		{delaybridge.Config{AMQPURL: "amqp://x", Scanner: &scanner.Config{Business: &scanner.Business{Name: "b"}}}, "needs Query and Handle"},
	} {
		if _, err := delaybridge.NewClient(db, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewClient(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	var nc *settings.NotConfiguredError
	if _, err := delaybridge.NewClient(db, delaybridge.Config{}); !errors.As(err, &nc) || nc.Setting != "amqp-url" {
		t.Errorf("no AMQP URL: %v, want a NotConfiguredError for amqp-url", err)
	}
	if _, err := delaybridge.NewClient(nil, delaybridge.Config{AMQPURL: "amqp://x"}); err == nil {
		t.Error("NewClient(nil db) accepted")
	}
	// A secret setting has a -file twin to name; the name server has none.
	if msg := (&settings.NotConfiguredError{Setting: "amqp-url", What: "no RabbitMQ configured"}).Error(); !strings.Contains(msg, "--amqp-url-file") {
		t.Errorf("amqp-url not configured: %q does not name --amqp-url-file", msg)
	}
	msg := (&settings.NotConfiguredError{Setting: "rocketmq-namesrv", What: "no RocketMQ name server configured"}).Error()
	if !strings.Contains(msg, "--rocketmq-namesrv") || !strings.Contains(msg, "DELAYBRIDGE_ROCKETMQ_NAMESRV") || strings.Contains(msg, "-file") {
		t.Errorf("rocketmq-namesrv not configured: %q, want the flag and its environment variable and no -file twin, which it does not have", msg)
	}
}

func TestClient_HandleRefusesBadTopicsDuplicatesAndLateRegistration(t *testing.T) {
	t.Parallel()
	c, err := delaybridge.NewClient(&sql.DB{}, delaybridge.Config{AMQPURL: "amqp://x"})
	if err != nil {
		t.Fatal(err)
	}
	fn := func(context.Context, *sql.Tx, *broker.Message) error { return nil }
	if err := c.Handle("bad topic", fn); !errors.Is(err, broker.ErrInvalidTopic) {
		t.Errorf("Handle(bad topic) = %v, want ErrInvalidTopic", err)
	}
	if err := c.Handle("t", nil); err == nil {
		t.Error("Handle(nil) accepted")
	}
	if err := c.Handle("t", fn); err != nil {
		t.Fatal(err)
	}
	if err := c.Handle("t", fn); err == nil || !strings.Contains(err.Error(), "already has a handler") {
		t.Errorf("second Handle(t) = %v", err)
	}
	// Stop before Start is a no-op, and a stopped client does not start.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Errorf("Stop before Start = %v", err)
	}
	if err := c.Start(ctx); !errors.Is(err, delaybridge.ErrStarted) {
		t.Errorf("Start after Stop = %v, want ErrStarted", err)
	}
	if err := c.Handle("u", fn); !errors.Is(err, delaybridge.ErrStarted) {
		t.Errorf("Handle after Stop = %v, want ErrStarted", err)
	}
}

func TestRabbitConfig_DeadLetteringFlag(t *testing.T) {
	clearEnv(t)
	for _, c := range []struct {
		args []string
		want rabbit.DeadLettering
		err  string
	}{
		{nil, rabbit.AtLeastOnce, ""},
		{[]string{"--rabbit-dead-lettering", "at-most-once"}, rabbit.AtMostOnce, ""},
		{[]string{"--rabbit-dead-lettering", "at-least-once"}, rabbit.AtLeastOnce, ""},
		{[]string{"--rabbit-dead-lettering", "exactly-once"}, 0, "--rabbit-dead-lettering"},
	} {
		cfg, err := delaybridge.LoadConfig(append([]string{"--amqp-url", "amqp://u:p@127.0.0.1:5672/"}, c.args...))
		if err != nil {
			t.Fatal(err)
		}
		rc, err := cfg.RabbitConfig()
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "at-most-once") {
				t.Errorf("%v: err = %v, want one naming %s and the choices", c.args, err, c.err)
			}
			continue
		}
		if err != nil || rc.DeadLettering != c.want {
			t.Errorf("%v: DeadLettering = %v, %v; want %v", c.args, rc.DeadLettering, err, c.want)
		}
	}
}

// --rocketmq-consume-goroutines reaches the adapter; values the client
// cannot take are refused with the range.
func TestRocketConfig_ConsumeGoroutinesFlag(t *testing.T) {
	clearEnv(t)
	for _, c := range []struct {
		args []string
		want int
		err  string
	}{
		{nil, rocket.DefaultConsumeGoroutines, ""},
		{[]string{"--rocketmq-consume-goroutines", "4096"}, 4096, ""},
		{[]string{"--rocketmq-consume-goroutines", "-1"}, 0, "want 1 to 100000"},
		{[]string{"--rocketmq-consume-goroutines", "200000"}, 0, "want 1 to 100000"},
	} {
		cfg, err := delaybridge.LoadConfig(append([]string{"--broker", "rocket"}, c.args...))
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		rc, err := cfg.RocketConfig()
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: err = %v, want %q", c.args, err, c.err)
			}
			continue
		}
		if err != nil || rc.ConsumeGoroutines != c.want {
			t.Errorf("%v: ConsumeGoroutines %d (err %v), want %d", c.args, rc.ConsumeGoroutines, err, c.want)
		}
	}
}

// A RocketMQ client in levels mode takes a list with day levels.
func TestRocketConfig_LevelsModeTakesDays(t *testing.T) {
	t.Parallel()
	cfg, err := delaybridge.Config{Broker: "rocket", RocketMode: "levels", RocketLevels: "1s 1m 1h 1d", RocketNameServers: "127.0.0.1:9876"}.RocketConfig()
	if err != nil {
		t.Fatal(err)
	}
	if lv := cfg.Limits.Levels; len(lv) != 4 || lv[3] != 24*time.Hour {
		t.Fatalf("levels = %v, want four ending in 24h", lv)
	}
}
