package main

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
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
