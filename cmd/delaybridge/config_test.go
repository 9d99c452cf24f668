package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge"
)

func TestParseConfigFile_RejectsBadLines(t *testing.T) {
	good, err := delaybridge.ParseConfigFile(strings.NewReader("# c\n\nmysql-dsn = \"a=b\"\nlog-level=warn\n"))
	if err != nil || good["mysql-dsn"] != "a=b" || good["log-level"] != "warn" {
		t.Fatalf("parse = %v, %v", good, err)
	}
	for _, bad := range []string{"no equals sign", "= value", "a b = c", "x = 1\nx = 2"} {
		if _, err := delaybridge.ParseConfigFile(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseConfigFile(%q) accepted", bad)
		}
	}
}

func FuzzParseConfigFile(f *testing.F) {
	f.Add("mysql-dsn = x\n# c\nlog-level = \"debug\"\n")
	f.Add("a=\"\nb")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := delaybridge.ParseConfigFile(strings.NewReader(s))
		if err != nil {
			return
		}
		for k := range m {
			if !regexp.MustCompile(`^[a-z][a-z0-9_-]*$`).MatchString(k) {
				t.Fatalf("accepted bad name %q", k)
			}
		}
	})
}
