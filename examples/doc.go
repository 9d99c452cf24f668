// Package examples holds runnable programs that use delaybridge as a library;
// ordertimeout is the order service from the design: an unpaid order is
// cancelled and its stock released when its timeout task comes due.
package examples
