package cli

import (
	"net"
	"testing"
	"time"
)

// The endpoint's listener holds a connection past its cap in the accept
// queue until one it accepted closes.
func TestLimitListener_AcceptsNoMoreThanItsCapUntilOneCloses(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := NewLimitListener(inner, 2)
	defer ln.Close()
	accepted := make(chan net.Conn, 3)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first := <-accepted
	<-accepted
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted while two were open")
	case <-time.After(200 * time.Millisecond):
	}
	first.Close()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("closing a connection did not free a slot")
	}
	// Close wakes an Accept that waits for a slot.
	ln.Close()
	if _, err := ln.Accept(); err == nil {
		t.Fatal("Accept after Close succeeded")
	}
}

func TestNewHTTPServer_BoundsEveryPhaseOfAConnection(t *testing.T) {
	srv := NewHTTPServer(nil)
	// ReadTimeout too: without it a client that announces a body and sends
	// none holds its connection while the server drains the body after
	// answering (a refused login), and 32 such clients lock everyone out.
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Fatalf("timeouts: read header %v, read %v, write %v, idle %v; want all set", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout)
	}
	if srv.WriteTimeout < 2*5*time.Second {
		t.Fatalf("write timeout %v is shorter than a scrape that waits for another", srv.WriteTimeout)
	}
}
