package main

import (
	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"io"
	"log/slog"
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
	srv := cli.NewHTTPServer(h)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// More idle keep-alive connections than the cap do not lock a probe out:
// the endpoint closes the idlest to take the new one.
func TestHTTP_IdleKeepAliveConnectionsDoNotLockOutHealthz(t *testing.T) {
	addr := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") }))
	for range cli.HTTPMaxConns + 8 {
		if _, resp := testenv.KeepAlive(t, addr, "/healthz"); resp.Close {
			t.Fatal("the server closed a keep-alive connection after a plain answer; the test tests nothing")
		}
	}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("/healthz with %d idle connections open: %v", cli.HTTPMaxConns+8, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %d", resp.StatusCode)
	}
}
