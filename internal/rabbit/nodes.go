package rabbit

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
)

// nodeRing is the list of node URLs a Publisher or Subscriber dials: URL
// first, then one per Config.Nodes. Every dial starts at the node after the
// one the previous dial reached, so a client whose node died moves on to
// the next instead of waiting for it, and the connections of one client
// spread over the cluster.
type nodeRing struct {
	urls []string
	next atomic.Uint64
}

// newNodeRing builds the ring of base and nodes, each node taking base's
// scheme, user information, vhost and query.
func newNodeRing(base string, nodes []string) (*nodeRing, error) {
	r := &nodeRing{urls: []string{base}}
	if len(nodes) == 0 {
		return r, nil
	}
	u, err := url.Parse(base)
	if err != nil {
		return nil, errors.New("rabbit: Config.URL does not parse") // checkURL has said why
	}
	seen := map[string]bool{strings.ToLower(u.Host): true}
	for i, node := range nodes {
		host, port, err := net.SplitHostPort(node)
		if p, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || p < 1 || p > 65535 || strings.ContainsAny(node, "/@?#") {
			return nil, fmt.Errorf("rabbit: Config.Nodes[%d] %q: want host:port of another node of the cluster", i, node)
		}
		if seen[strings.ToLower(node)] {
			return nil, fmt.Errorf("rabbit: Config.Nodes[%d] %q: listed twice (Config.URL counts)", i, node)
		}
		seen[strings.ToLower(node)] = true
		nu := *u
		nu.Host = node
		r.urls = append(r.urls, nu.String())
	}
	return r, nil
}

// order returns the URLs in the order the next dial tries them and the
// index of the first.
func (r *nodeRing) order() (urls []string, first int) {
	first = int(r.next.Load() % uint64(len(r.urls)))
	return append(r.urls[first:len(r.urls):len(r.urls)], r.urls[:first]...), first
}

// reached records that the dial got through to urls[i] of order's list
// starting at first: the next dial starts after it.
func (r *nodeRing) reached(first, i int) {
	r.next.Store(uint64(first + i + 1))
}
