package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge"
	"github.com/delaybridge/delaybridge/internal/driver"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// testTLS are the local test CA and client certificate that
// scripts/services.sh makes.
type testTLS struct{ ca, cert, key, amqpsURL string }

// tlsFiles returns the test certificates, failing under CI=true and
// skipping elsewhere when scripts/services.sh has not made them.
func tlsFiles(t *testing.T) testTLS {
	t.Helper()
	dir := filepath.Join(moduleDir(t), ".services", "tls")
	env := func(k, file string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return filepath.Join(dir, file)
	}
	f := testTLS{
		ca:       env("DELAYBRIDGE_TEST_TLS_CA", "ca.pem"),
		cert:     env("DELAYBRIDGE_TEST_TLS_CLIENT_CERT", "client.pem"),
		key:      env("DELAYBRIDGE_TEST_TLS_CLIENT_KEY", "client-key.pem"),
		amqpsURL: os.Getenv("DELAYBRIDGE_TEST_AMQPS_URL"),
	}
	if f.amqpsURL == "" {
		f.amqpsURL = "amqps://delaybridge:delaybridge@127.0.0.1:5671/"
	}
	for _, p := range []string{f.ca, f.cert, f.key} {
		if _, err := os.Stat(p); err != nil {
			testenv.Unreachable(t, "test TLS certificates", p, err)
		}
	}
	return f
}

func moduleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// mariadbRoot runs SQL as MariaDB's root over the local socket, as
// scripts/services.sh does.
func mariadbRoot(t *testing.T, sql string) {
	t.Helper()
	out, err := exec.Command("mariadb", "-uroot", "-e", sql).CombinedOutput()
	if err != nil {
		t.Fatalf("mariadb -uroot: %v\n%s", err, out)
	}
}

func TestTLS_DoctorReportsEncryptedDatabaseAndRabbitMQSessions(t *testing.T) {
	f := tlsFiles(t)
	dsn := scratch(t)
	prefix := testenv.Name("tls")
	t.Cleanup(func() { testenv.DeleteRabbitPrefix(t, testenv.AMQP(t), prefix) })
	out := mustRun(t, "doctor", "--mysql-dsn", dsn, "--mysql-tls-ca", f.ca,
		"--broker", "rabbit", "--amqp-url", f.amqpsURL, "--amqp-tls-ca", f.ca, "--rabbit-prefix", prefix, "--rabbit-depth", "8")
	for _, want := range []string{"OK    database connection uses TLS (cipher ", "OK    RabbitMQ connection uses TLS 1.", "0 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
	// The same services without the TLS flags: no TLS line at all.
	out = mustRun(t, append([]string{"doctor", "--mysql-dsn", dsn}, testenv.RabbitFlags(t)...)...)
	if strings.Contains(out, "uses TLS") {
		t.Errorf("doctor reports TLS on plain connections:\n%s", out)
	}
}

func TestTLS_MariaDBVerifiesTheServerAndPresentsTheClientCertificate(t *testing.T) {
	f := tlsFiles(t)
	testenv.MySQL(t)
	// A user that must present a certificate signed by the test CA.
	user := fmt.Sprintf("dbtls_%d", rand.Uint32())
	db := "delaybridge_" + user
	mariadbRoot(t, fmt.Sprintf("CREATE DATABASE %[2]s; CREATE USER '%[1]s'@'127.0.0.1' IDENTIFIED BY 'tls-pass' REQUIRE X509; GRANT ALL ON %[2]s.* TO '%[1]s'@'127.0.0.1';", user, db))
	t.Cleanup(func() {
		mariadbRoot(t, fmt.Sprintf("DROP USER IF EXISTS '%s'@'127.0.0.1'; DROP DATABASE IF EXISTS %s;", user, db))
	})
	dsn := fmt.Sprintf("%s:tls-pass@tcp(127.0.0.1:3306)/%s", user, db)

	out := mustRun(t, "migrate", "--mysql-dsn", dsn, "--mysql-tls-ca", f.ca, "--mysql-tls-cert", f.cert, "--mysql-tls-key", f.key)
	if !strings.Contains(out, "applied migrations") {
		t.Fatalf("migrate over TLS with a client certificate printed %q", out)
	}
	// The session really is encrypted, with the configuration the CLI builds.
	a := settingsAfter(t, []string{"--mysql-dsn", dsn, "--mysql-tls-ca", f.ca, "--mysql-tls-cert", f.cert, "--mysql-tls-key", f.key})
	pool, err := a.openDB(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var name, cipher string
	if err := pool.QueryRow("SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher); err != nil || cipher == "" {
		t.Fatalf("Ssl_cipher %q, %v: the session is not encrypted", cipher, err)
	}

	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"without the client certificate the X509 user is refused", []string{"--mysql-tls-ca", f.ca}, "Access denied"},
		{"without TLS the X509 user is refused", nil, "Access denied"},
		{"a CA that did not sign the server certificate fails verification", []string{"--mysql-tls-ca", f.cert, "--mysql-tls-cert", f.cert, "--mysql-tls-key", f.key}, "certificate signed by unknown authority"},
		{"a server name the certificate lacks fails verification", []string{"--mysql-tls-ca", f.ca, "--mysql-tls-cert", f.cert, "--mysql-tls-key", f.key, "--mysql-tls-server-name", "db.example.com"}, "not db.example.com"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := run(t, append([]string{"status", "--mysql-dsn", dsn}, c.args...)...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want an error with %q, got %v", c.want, err)
			}
		})
	}
}

func TestTLS_AMQPSListenerEncryptsAndSeesTheClientCertificate(t *testing.T) {
	f := tlsFiles(t)
	testenv.AMQP(t)
	a := settingsAfter(t, nil)
	bf := brokerFlags{Settings: driver.Settings{AMQPURL: f.amqpsURL, RabbitMode: "ladder", RabbitPrefix: testenv.Name("tls"), RabbitUnit: rabbit.DefaultUnit, RabbitDepth: 4, RabbitPrefetch: rabbit.DefaultPrefetch,
		AMQPTLS: delaybridge.TLSFiles{CA: f.ca, Cert: f.cert, Key: f.key}}}
	t.Cleanup(func() { testenv.DeleteRabbitPrefix(t, testenv.AMQP(t), bf.RabbitPrefix) })
	cfg, err := bf.rabbitConfig(&a)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnectionName = testenv.Name("tlsconn")
	pub, err := rabbit.NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatalf("publisher over amqps: %v", err)
	}
	defer pub.Close()
	// RabbitMQ's own view of the connection: TLS, with our client certificate.
	var seen string
	testutil.Eventually(10*time.Second, 200*time.Millisecond, func() bool {
		for _, line := range strings.Split(testenv.Rabbitmqctl(t, "list_connections", "client_properties", "ssl", "ssl_protocol", "peer_cert_subject", "--quiet", "--no-table-headers"), "\n") {
			if strings.Contains(line, cfg.ConnectionName) {
				seen = line
			}
		}
		return seen != ""
	}) // the checks below say what is missing
	if !strings.Contains(seen, "true") || !strings.Contains(seen, "tlsv1.") || !strings.Contains(seen, "CN=delaybridge-test-client") {
		t.Fatalf("rabbitmqctl list_connections shows %q: want ssl true, a TLS protocol and the client certificate's subject", seen)
	}

	// Plain AMQP to the TLS port, and TLS to the plain port, both fail.
	plain := strings.Replace(f.amqpsURL, "amqps://", "amqp://", 1)
	if conn, err := amqp.DialConfig(plain, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)}); err == nil {
		conn.Close()
		t.Fatalf("plain AMQP to %s succeeded", rabbit.RedactURL(plain))
	}
	cfg.URL = strings.Replace(testenv.AMQPURL(), "amqp://", "amqps://", 1)
	cfg.DialTimeout = 3 * time.Second
	if p, err := rabbit.NewPublisher(context.Background(), cfg); err == nil {
		p.Close()
		t.Fatalf("TLS to the plain port %s succeeded", rabbit.RedactURL(cfg.URL))
	}
}

func TestTLS_BadSettingsAreClearErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--mysql-tls-cert", notPEM}, "--mysql-tls-cert and --mysql-tls-key go together"},
		{[]string{"status", "--mysql-tls-ca", notPEM}, "--mysql-tls-ca: no PEM certificate in " + notPEM},
		{[]string{"status", "--mysql-tls-ca", filepath.Join(dir, "missing.pem")}, "no such file"},
		{[]string{"status", "--mysql-tls-cert", notPEM, "--mysql-tls-key", notPEM}, "--mysql-tls-cert " + notPEM},
		{[]string{"status", "--mysql-dsn", "u:p@tcp(127.0.0.1:3306)/x?tls=true", "--mysql-tls-ca", notPEM}, "no PEM certificate"},
		{[]string{"doctor", "--amqp-url", "amqp://u:p@127.0.0.1:5672/", "--amqp-tls-ca", notPEM}, "no PEM certificate"},
		{[]string{"doctor", "--rocketmq-access-key", "ak", "--broker", "rocket"}, "--rocketmq-access-key and --rocketmq-secret-key go together"},
	} {
		// doctor reports its failures in its output and exits 1.
		out, _, err := run(t, c.args...)
		if err == nil || !strings.Contains(err.Error()+out, c.want) {
			t.Errorf("%v: want %q in the error, got %v\n%s", c.args, c.want, err, out)
		}
	}
	// A DSN that already chooses its TLS conflicts with the flags.
	ca := filepath.Join(dir, "ca.pem")
	writeCA(t, ca)
	if _, _, err := run(t, "status", "--mysql-dsn", "u:p@tcp(127.0.0.1:3306)/x?tls=true", "--mysql-tls-ca", ca); err == nil || !strings.Contains(err.Error(), "tls=true in --mysql-dsn: use one") {
		t.Errorf("tls= in the DSN and --mysql-tls-ca: %v", err)
	}
	if out, _, err := run(t, "doctor", "--amqp-url", "amqp://u:p@127.0.0.1:5672/", "--amqp-tls-ca", ca, "--mysql-dsn", "u:p@tcp(127.0.0.1:1)/x"); err == nil || !strings.Contains(out, "--amqp-tls-* flags need an amqps:// --amqp-url") {
		t.Errorf("TLS flags with amqp://: %v\n%s", err, out)
	}
}

// writeCA writes a freshly made self-signed CA certificate to path.
func writeCA(t *testing.T, path string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "unrelated test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(crand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Encryption without verification is reported as a warning, not as OK:
// tls=skip-verify in the DSN, and --rocketmq-tls, whose client never
// verifies. run logs the RocketMQ one before it refuses a bad flag.
func TestTLS_DoctorWarnsOfUnverifiedTLS(t *testing.T) {
	tlsFiles(t)
	dsn := scratch(t)
	out := mustRun(t, append([]string{"doctor", "--mysql-dsn", dsn + "&tls=skip-verify"}, testenv.RabbitFlags(t)...)...)
	if !strings.Contains(out, "WARN  database connection uses TLS (cipher ") || !strings.Contains(out, "does not verify the server's certificate (tls=skip-verify") ||
		strings.Contains(out, "OK    database connection uses TLS") {
		t.Errorf("doctor with tls=skip-verify:\n%s", out)
	}
	out, _, err := run(t, "doctor", "--mysql-dsn", dsn, "--broker", "rocket", "--rocketmq-tls", "--rocketmq-mode", "bogus")
	if err == nil || !strings.Contains(out, "WARN  --rocketmq-tls: the RocketMQ client does not verify") {
		t.Errorf("doctor --rocketmq-tls: %v\n%s", err, out)
	}
	_, errOut, err := run(t, "run", "--mysql-dsn", dsn, "--broker", "rocket", "--rocketmq-tls", "--rocketmq-mode", "bogus")
	if err == nil || !strings.Contains(err.Error(), "--rocketmq-mode") || !strings.Contains(errOut, "level=WARN") || !strings.Contains(errOut, "does not verify") {
		t.Errorf("run --rocketmq-tls: %v\n%s", err, errOut)
	}
}
