package console

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// serveHTTP serves h as the console serves, on a loopback port, and
// returns the address.
func serveHTTP(t *testing.T, h http.Handler) string {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := cli.NewHTTPServer(h)
	go func() { _ = srv.Serve(cli.NewLimitListener(inner, cli.HTTPMaxConns)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return inner.Addr().String()
}

// A refused login closes its connection: a guesser pays a new connection,
// and a failed guess holds no slot of the cap.
func TestConsole_UnauthorizedAnswerClosesTheConnection(t *testing.T) {
	c := &console{log: slog.New(slog.DiscardHandler), cred: credential{user: "ops", password: testConsolePassword}}
	addr := serveHTTP(t, c.guard(http.NotFoundHandler()))
	conn, resp := testenv.KeepAlive(t, addr, "/")
	// resp.Close: the answer said Connection: close (ReadResponse takes
	// the header out once it has read it).
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("answer without the credential: %d, close %v; want 401 with Connection: close", resp.StatusCode, resp.Close)
	}
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the 401 the connection is still open: read %d bytes, %v", n, err)
	}
}

// The console over TLS, HTTP/1.1 and HTTP/2 alike: idle connections past
// the cap give way to a new one (the listener's connection sits beneath
// the *tls.Conn).
func TestHTTP_IdleTLSConnectionsGiveWay(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	cert := testenv.WriteServerCert(t, certPath, keyPath)
	tlsCfg, err := loadTLS(Options{tlsCert: certPath, tlsKey: keyPath})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := cli.NewLimitListener(inner, cli.HTTPMaxConns)
	srv := cli.NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.Proto) }))
	srv.TLSConfig = tlsCfg
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	get := func(h2 bool) (*http.Client, string, error) {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: h2}
		t.Cleanup(tr.CloseIdleConnections)
		cl := &http.Client{Transport: tr, Timeout: 3 * time.Second}
		resp, err := cl.Get("https://" + inner.Addr().String() + "/")
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return cl, string(b), nil
	}
	for i := range cli.HTTPMaxConns + 4 {
		_, proto, err := get(i%2 == 0)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if want := map[bool]string{true: "HTTP/2.0", false: "HTTP/1.1"}[i%2 == 0]; proto != want {
			t.Fatalf("connection %d spoke %s, want %s", i, proto, want)
		}
	}
}
