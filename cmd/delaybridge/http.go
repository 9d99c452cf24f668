package main

import (
	"fmt"
	"net"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
)

// listenHTTP listens on addr for the metrics and health endpoint, at most
// cli.HTTPMaxConns busy connections at once, and warns when the address is
// reachable from beyond this host: the endpoint has neither authentication
// nor TLS.
func (a *app) listenHTTP(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http %s: %w", addr, err)
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		a.log.Warn("delaybridge: the HTTP endpoint listens beyond loopback; it has no authentication or TLS, so anyone who reaches it sees topics and backlogs (see SECURITY.md)",
			"http", ln.Addr().String())
	}
	return cli.NewLimitListener(ln, cli.HTTPMaxConns), nil
}
