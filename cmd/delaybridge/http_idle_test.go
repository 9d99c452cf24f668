package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// serveHTTP serves h as run serves its endpoint, on a loopback port, and
// returns the address.
func serveHTTP(t *testing.T, h http.Handler) string {
	t.Helper()
	a := &app{log: slog.New(slog.DiscardHandler)}
	ln, err := a.listenHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(h)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// keepAlive sends one request on a new connection, reads the answer and
// leaves the connection open and idle.
func keepAlive(t *testing.T, addr, path string) (net.Conn, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = c.SetDeadline(time.Time{})
	return c, resp
}

// More idle keep-alive connections than the cap do not lock a probe out:
// the endpoint closes the idlest to take the new one.
func TestHTTP_IdleKeepAliveConnectionsDoNotLockOutHealthz(t *testing.T) {
	addr := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") }))
	for range httpMaxConns + 8 {
		if _, resp := keepAlive(t, addr, "/healthz"); resp.Close {
			t.Fatal("the server closed a keep-alive connection after a plain answer; the test tests nothing")
		}
	}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("/healthz with %d idle connections open: %v", httpMaxConns+8, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %d", resp.StatusCode)
	}
}

// A refused login closes its connection: a guesser pays a new connection,
// and a failed guess holds no slot of the cap.
func TestConsole_UnauthorizedAnswerClosesTheConnection(t *testing.T) {
	c := &console{log: slog.New(slog.DiscardHandler), cred: consoleCredential{user: "ops", password: testConsolePassword}}
	addr := serveHTTP(t, c.guard(http.NotFoundHandler()))
	conn, resp := keepAlive(t, addr, "/")
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
	cert := writeServerCert(t, certPath, keyPath)
	tlsCfg, err := consoleTLS(consoleOptions{tlsCert: certPath, tlsKey: keyPath})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := newLimitListener(inner, httpMaxConns)
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.Proto) }))
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
	for i := range httpMaxConns + 4 {
		_, proto, err := get(i%2 == 0)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if want := map[bool]string{true: "HTTP/2.0", false: "HTTP/1.1"}[i%2 == 0]; proto != want {
			t.Fatalf("connection %d spoke %s, want %s", i, proto, want)
		}
	}
}
