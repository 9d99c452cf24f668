package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "delaybridge:", terminalSafe(err.Error()))
		os.Exit(1)
	}
}

// terminalSafe escapes the control characters of s but its line breaks,
// so an error that quotes a task key or a broker's answer cannot move the
// cursor, clear the screen or retitle the terminal it is printed on.
func terminalSafe(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return r != '\n' && r != '\t' && !strconv.IsPrint(r) }) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if r == '\n' || r == '\t' || strconv.IsPrint(r) {
			b.WriteRune(r)
			continue
		}
		q := strconv.QuoteRune(r)
		b.WriteString(q[1 : len(q)-1])
	}
	return b.String()
}
