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
	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/rocket"
	"github.com/delaybridge/delaybridge/internal/scanner"
	"github.com/delaybridge/delaybridge/internal/settings"
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
	want := *delaybridge.Flat(delaybridge.DefaultConfig())
	want.Broker, want.RocketGroupPrefix = "rocket", "from-file"
	want.RabbitPrefix = "from-env"
	want.RabbitDepth = 11
	got := *delaybridge.Flat(cfg)
	if got.Broker != want.Broker || got.RocketGroupPrefix != want.RocketGroupPrefix || got.RabbitPrefix != want.RabbitPrefix ||
		got.RabbitDepth != want.RabbitDepth || cfg.MySQLDSN != "u:p@tcp(db:3306)/x" || got.RabbitUnit != want.RabbitUnit || got.RocketQueues != want.RocketQueues {
		t.Errorf("LoadConfig = %+v, DSN %q\nwant %+v", got, cfg.MySQLDSN, want)
	}
	if cfg.Broker != nil {
		t.Errorf("LoadConfig built Broker %v; NewClient builds it from the flat settings", cfg.Broker)
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
	if flat := delaybridge.Flat(cfg); *orders != 7 || flat.Broker != "rocket" || flat.RocketMode != "levels" {
		t.Errorf("orders %d, broker %q, mode %q", *orders, flat.Broker, flat.RocketMode)
	}
}

func TestNewClient_RefusesBadSettingsWithoutConnecting(t *testing.T) {
	clearEnv(t)
	db := &sql.DB{}
	rabbitX := func(c *delaybridge.Config) { c.Broker = rabbit.New(rabbit.Config{URL: "amqp://x"}) }
	for _, tc := range []struct {
		args []string // flat settings, read as LoadConfig reads them
		mod  func(*delaybridge.Config)
		want string
	}{
		{args: []string{"--broker", "kafka"}, want: `--broker "kafka"`},
		{want: "no RabbitMQ configured"},
		{mod: func(c *delaybridge.Config) { c.Broker = rabbit.New(rabbit.Config{}) }, want: "no RabbitMQ configured"},
		{args: []string{"--amqp-url", "amqp://x", "--rabbit-mode", "plugin"}, want: `--rabbit-mode "plugin"`},
		{args: []string{"--broker", "rocket", "--rocketmq-mode", "levels", "--rocketmq-levels", "1x"}, want: "--rocketmq-levels"},
		{args: []string{"--broker", "rocket", "--rocketmq-access-key", "ak"}, want: "go together"},
		{args: []string{"--amqp-url", "amqp://x", "--rabbit-depth", "-1"}, want: "--rabbit-depth -1"},
		{args: []string{"--amqp-url", "http://x"}, want: "not a valid AMQP URL"},
		{mod: func(c *delaybridge.Config) { c.Broker = rabbit.New(rabbit.Config{URL: "http://x"}) }, want: "not a valid AMQP URL"},
		{args: []string{"--broker", "rocket", "--rocketmq-group-prefix", "a b"}, want: "Config.GroupPrefix"},
		{mod: func(c *delaybridge.Config) {
			c.Broker = rocket.New(rocket.Config{NameServers: []string{"x:1"}, GroupPrefix: "a b"})
		}, want: "Config.GroupPrefix"},
		{mod: func(c *delaybridge.Config) {
			c.Broker = rocket.New(rocket.Config{NameServers: []string{"x:1"}, CreateTopics: true})
		}, want: "needs a BrokerAddr"},
		{mod: func(c *delaybridge.Config) { rabbitX(c); c.SigningKeys = "k" }, want: "--signing-keys"},
		{mod: func(c *delaybridge.Config) {
			rabbitX(c)
			c.Relay = &delaybridge.RelayConfig{Lookahead: time.Millisecond}
		}, want: "Config.Relay: outbox: NewRelay: Lookahead 1ms"},
		{mod: func(c *delaybridge.Config) { rabbitX(c); c.Scanner = &scanner.Config{Lease: time.Second} }, want: "Config.Scanner: scanner: Lease 1s"},
		{mod: func(c *delaybridge.Config) {
			rabbitX(c)
			c.Scanner = &scanner.Config{Business: &scanner.Business{Name: "b"}}
		}, want: "needs Query and Handle"},
	} {
		cfg, err := delaybridge.LoadConfig(tc.args)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if tc.mod != nil {
			tc.mod(&cfg)
		}
		if _, err := delaybridge.NewClient(db, cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewClient(%v) = %v, want %q", tc.args, err, tc.want)
		}
	}
	var nc *settings.NotConfiguredError
	if _, err := delaybridge.NewClient(db, delaybridge.Config{}); !errors.As(err, &nc) || nc.Setting != "amqp-url" {
		t.Errorf("no AMQP URL: %v, want a NotConfiguredError for amqp-url", err)
	}
	if _, err := delaybridge.NewClient(nil, delaybridge.Config{Broker: rabbit.New(rabbit.Config{URL: "amqp://x"})}); err == nil {
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
	c, err := delaybridge.NewClient(&sql.DB{}, delaybridge.Config{Broker: rabbit.New(rabbit.Config{URL: "amqp://x"})})
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
