package cli

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Printable returns s as a table or a report may show it: unchanged when
// every rune is Printable, otherwise quoted with Go's escapes (strconv.Quote).
// Keys and last errors come from whoever scheduled the task or from a
// broker; printed raw, a newline or a terminal escape in one would forge
// lines of the output, and a tab would shift a table's columns. Text that
// starts with '"' is quoted too, so an escaped and a plain value never look
// alike.
func Printable(s string) string {
	if utf8.ValidString(s) && !strings.HasPrefix(s, `"`) && strings.IndexFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) < 0 {
		return s
	}
	return strconv.Quote(s)
}
