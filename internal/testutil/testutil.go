// Package testutil holds the helpers the tests of every package share. It
// imports nothing but the standard library, so any package's tests can use
// it without an import cycle.
package testutil

import "time"

// Eventually calls cond until it returns true or wait has passed, pausing
// tick between calls, and reports whether cond returned true. cond runs on
// the caller's goroutine, so it may call t.Fatal; it is always called at
// least once, and once more after wait has passed, so a condition that
// became true during the last pause still counts. The caller says what
// failed, with the last state cond saw:
//
//	var done int
//	if !testutil.Eventually(10*time.Second, 50*time.Millisecond, func() bool {
//		done = count(t, "state = 'done'")
//		return done == n
//	}) {
//		t.Fatalf("%d of %d tasks done after 10s", done, n)
//	}
func Eventually(wait, tick time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(wait)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(tick)
	}
}
