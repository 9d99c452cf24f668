package cli

import "testing"

func TestPrintable_QuotesOnlyWhatCouldForgeOutput(t *testing.T) {
	for in, want := range map[string]string{
		"order-1":          "order-1",
		"with space é 订单":  "with space é 订单",
		"k\nOK fake line":  `"k\nOK fake line"`,
		"\x1b[2Jcleared":   `"\x1b[2Jcleared"`,
		"col\tshift":       `"col\tshift"`,
		"bidi\u202eevil":   `"bidi\u202eevil"`,
		"bad\xffutf8":      `"bad\xffutf8"`,
		`"looks quoted\n"`: `"\"looks quoted\\n\""`,
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %s, want %s", in, got, want)
		}
	}
}
