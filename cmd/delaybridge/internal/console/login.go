package console

import (
	"log/slog"
	"net"
	"sync"
	"time"
)

// The console's answer to wrong passwords. Each wrong one makes its
// address wait before its next is even checked, twice as long as after the
// one before: loginFirstDelay, doubling up to loginMaxDelay. Beyond
// loginGlobalRate wrong passwords a second from all addresses together
// (loginGlobalBurst at once), only addresses that logged in within
// loginKnownFor are checked. A right password from an address clears its
// count.
const (
	loginFirstDelay  = 250 * time.Millisecond
	loginMaxDelay    = time.Minute
	loginForget      = 15 * time.Minute // an address's count is forgotten this long after its last wrong password
	loginGlobalRate  = 2.0
	loginGlobalBurst = 30.0
	loginKnownFor    = 24 * time.Hour
	loginMaxAddrs    = 4096 // addresses remembered; past it an unknown address waits for the global budget
)

// loginThrottle counts wrong passwords by address. Its log lines are few:
// an address's first wrong password, then each time its count doubles, and
// the global limit as it starts and ends, each with what was refused since.
type loginThrottle struct {
	now func() time.Time
	log *slog.Logger

	mu      sync.Mutex
	addrs   map[string]*loginAddrState
	known   map[string]time.Time // addresses that logged in, and when
	tokens  float64              // global budget of wrong passwords
	filled  time.Time            // when tokens was last topped up
	limited bool                 // the global limit is on
	refused int                  // refused unchecked under the global limit
}

type loginAddrState struct {
	failures int
	until    time.Time // no check before then
	last     time.Time // the last wrong password
	refused  int       // refused unchecked since the last log line
}

func newLoginThrottle(now func() time.Time, log *slog.Logger) *loginThrottle {
	return &loginThrottle{now: now, log: log, addrs: map[string]*loginAddrState{}, known: map[string]time.Time{}, tokens: loginGlobalBurst, filled: now()}
}

// loginAddr is the address a login is counted under: the host of
// remote, an IPv6 host by its /64, which one machine often holds whole.
func loginAddr(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return host
}

// loginDelay is how long an address waits after its n-th wrong password
// in a row.
func loginDelay(n int) time.Duration {
	d := loginFirstDelay
	for i := 1; i < n && d < loginMaxDelay; i++ {
		d *= 2
	}
	return min(d, loginMaxDelay)
}

// admit returns how long addr must wait before its credential is checked,
// 0 to check it now. An address with wrong passwords behind it is held for
// its next delay while one check is under way, so guesses sent at once are
// checked one at a time.
func (t *loginThrottle) admit(addr string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.fill(now)
	st := t.addrs[addr]
	if st != nil && now.Before(st.until) {
		st.refused++
		return st.until.Sub(now)
	}
	known := now.Sub(t.known[addr]) < loginKnownFor
	if !known && (t.tokens < 1 || st == nil && len(t.addrs) >= loginMaxAddrs && !t.prune(now)) {
		if !t.limited {
			t.limited = true
			t.log.Warn("console: wrong passwords from many addresses: until they slow down, only addresses that logged in before are checked",
				"limit_per_second", loginGlobalRate)
		}
		t.refused++
		return time.Second
	}
	if st != nil && st.failures > 0 {
		st.until = now.Add(loginDelay(st.failures + 1))
	}
	return 0
}

// fill tops up the global budget, and ends the global limit once it is
// full again.
func (t *loginThrottle) fill(now time.Time) {
	t.tokens = min(loginGlobalBurst, t.tokens+now.Sub(t.filled).Seconds()*loginGlobalRate)
	t.filled = now
	if t.limited && t.tokens >= loginGlobalBurst {
		t.limited = false
		t.log.Warn("console: wrong passwords slowed down: every address is checked again", "refused_unchecked", t.refused)
		t.refused = 0
	}
}

// prune forgets the addresses whose count has lapsed, and reports whether
// there is room for another.
func (t *loginThrottle) prune(now time.Time) bool {
	for a, st := range t.addrs {
		if now.Sub(st.last) > loginForget && !now.Before(st.until) {
			delete(t.addrs, a)
		}
	}
	for a, at := range t.known {
		if now.Sub(at) >= loginKnownFor {
			delete(t.known, a)
		}
	}
	return len(t.addrs) < loginMaxAddrs
}

// failed counts a wrong password from addr (remote is logged).
func (t *loginThrottle) failed(addr, remote string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.fill(now)
	t.tokens = max(0, t.tokens-1)
	st := t.addrs[addr]
	if st == nil || now.Sub(st.last) > loginForget {
		if st == nil && len(t.addrs) >= loginMaxAddrs && !t.prune(now) {
			return // the global budget alone answers it
		}
		st = &loginAddrState{}
		t.addrs[addr] = st
	}
	st.failures++
	st.last = now
	st.until = now.Add(loginDelay(st.failures))
	if st.failures&(st.failures-1) == 0 { // 1, 2, 4, 8, ...
		t.log.Warn("console: refused a wrong user or password", "remote", remote, "wrong_in_a_row", st.failures,
			"next_check_in", loginDelay(st.failures), "refused_unchecked", st.refused)
		st.refused = 0
	}
}

// succeeded clears addr's count and remembers it as an address that logs in.
func (t *loginThrottle) succeeded(addr, remote string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if st := t.addrs[addr]; st != nil {
		if st.failures > 0 {
			t.log.Info("console: logged in after wrong passwords", "remote", remote, "wrong_in_a_row", st.failures)
		}
		delete(t.addrs, addr)
	}
	if _, ok := t.known[addr]; !ok && len(t.known) >= loginMaxAddrs {
		t.prune(now)
		if len(t.known) >= loginMaxAddrs {
			return
		}
	}
	t.known[addr] = now
}
