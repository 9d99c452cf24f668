package cli

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits of the metrics and health endpoint and of the console. Neither
// may let whoever reaches it hold resources for long: a slow client cannot
// keep a connection open past the timeouts, and many clients cannot open
// more than HTTPMaxConns connections between them. Idle keep-alive
// connections do not hold that cap against anyone: when it is reached, the
// longest idle one is closed to make room, so a probe still answers with
// hundreds of idle sockets open.
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
	// A scraper's interval (15 s and more) outlasts it anyway; a browser
	// clicking through the console keeps its connection.
	httpIdleTimeout = 10 * time.Second
	// HTTPMaxConns caps the connections reading or answering a request;
	// further clients wait in the kernel's accept queue. A scraper and a
	// probe or two need a handful.
	HTTPMaxConns = 32
)

// NewHTTPServer returns the server of the metrics and health endpoint or of
// the console. It tells a limitListener which of its connections are idle.
func NewHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		ConnState:         trackIdle,
	}
}

// trackIdle records on c's limitedConn, if it has one (under TLS, beneath
// the *tls.Conn), whether c is idle between requests.
func trackIdle(c net.Conn, st http.ConnState) {
	for c != nil {
		if lc, ok := c.(*limitedConn); ok {
			lc.setIdle(st == http.StateIdle)
			return
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return
		}
		c = u.NetConn()
	}
}

// limitListener accepts a connection only while fewer than cap(slots) are
// open. When none is free it closes the connection idle longest, as soon as
// one is idle, or takes the slot of one that closes.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
	idled     chan struct{} // a connection became idle

	mu    sync.Mutex
	conns map[*limitedConn]struct{}
}

// NewLimitListener limits ln to n busy connections at once (see
// limitListener).
func NewLimitListener(ln net.Listener, n int) net.Listener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), closed: make(chan struct{}), idled: make(chan struct{}, 1),
		conns: map[*limitedConn]struct{}{}}
}

// Accept takes a slot, then a connection; the slot is given back when the
// connection closes.
func (l *limitListener) Accept() (net.Conn, error) {
	for taken := false; !taken; {
		select {
		case l.slots <- struct{}{}:
			taken = true
			continue
		default:
		}
		l.closeIdlest()
		select {
		case l.slots <- struct{}{}:
			taken = true
		case <-l.idled:
		case <-l.closed:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	lc := &limitedConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[lc] = struct{}{}
	l.mu.Unlock()
	return lc, nil
}

// closeIdlest closes the connection that has been idle longest, if one is
// idle. A client whose idle connection is closed opens another, as it does
// after the server's idle timeout.
func (l *limitListener) closeIdlest() {
	l.mu.Lock()
	var idlest *limitedConn
	var since time.Time
	for c := range l.conns {
		if t, idle := c.idleSince(); idle && (idlest == nil || t.Before(since)) {
			idlest, since = c, t
		}
	}
	l.mu.Unlock()
	if idlest != nil {
		_ = idlest.Close()
	}
}

// Close closes the listener and wakes an Accept waiting for a slot.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitedConn gives its listener slot back on its first Close, and knows
// since when it is idle (trackIdle).
type limitedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once

	mu    sync.Mutex
	idle  bool
	since time.Time
}

func (c *limitedConn) setIdle(idle bool) {
	c.mu.Lock()
	if idle && !c.idle {
		c.since = time.Now()
	}
	c.idle = idle
	c.mu.Unlock()
	if idle {
		select {
		case c.l.idled <- struct{}{}:
		default:
		}
	}
}

func (c *limitedConn) idleSince() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.since, c.idle
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		<-c.l.slots
	})
	return err
}
