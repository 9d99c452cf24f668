package main

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits of the metrics and health endpoint. It has no authentication, so
// whoever reaches it must not be able to hold resources for long: a slow
// client cannot keep a connection open past the timeouts, and many clients
// cannot open more than httpMaxConns connections between them.
const (
	// httpReadHeaderTimeout bounds how long a client may take to send its
	// request headers.
	httpReadHeaderTimeout = 5 * time.Second
	// httpWriteTimeout bounds one request from the end of its headers to
	// the end of the answer. A scrape waits at most for the scrape in
	// flight and its own outbox query (5 s each), /readyz for a database
	// ping and a broker dial (3 s each).
	httpWriteTimeout = 30 * time.Second
	// httpReadTimeout bounds reading one whole request, its body too: a
	// client that sends headers announcing a body and then nothing would
	// otherwise hold its connection while the server drains that body
	// after answering (a refused login, say).
	httpReadTimeout = 30 * time.Second
	// httpIdleTimeout closes a keep-alive connection left idle this long.
	httpIdleTimeout = 60 * time.Second
	// httpMaxConns caps the open connections; further clients wait in the
	// kernel's accept queue. A scraper and a probe or two need a handful.
	httpMaxConns = 32
)

// listenHTTP listens on addr for the metrics and health endpoint, at most
// httpMaxConns connections at once, and warns when the address is reachable
// from beyond this host: the endpoint has neither authentication nor TLS.
func (a *app) listenHTTP(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http %s: %w", addr, err)
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		a.log.Warn("delaybridge: the HTTP endpoint listens beyond loopback; it has no authentication or TLS, so anyone who reaches it sees topics and backlogs (see SECURITY.md)",
			"http", ln.Addr().String())
	}
	return newLimitListener(ln, httpMaxConns), nil
}

// newHTTPServer returns the server of the metrics and health endpoint.
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
	}
}

// limitListener accepts a connection only while fewer than cap(slots) are
// open; Accept waits for one to close otherwise.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), closed: make(chan struct{})}
}

// Accept takes a slot, then a connection; the slot is given back when the
// connection closes.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, release: func() { <-l.slots }}, nil
}

// Close closes the listener and wakes an Accept waiting for a slot.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitedConn gives its listener slot back on its first Close.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
