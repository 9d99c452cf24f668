package testenv

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// KeepAlive sends one request on a new connection, reads the answer and
// leaves the connection open and idle.
func KeepAlive(t testing.TB, addr, path string) (net.Conn, *http.Response) {
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
