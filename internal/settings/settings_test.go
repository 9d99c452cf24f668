package settings

import (
	"regexp"
	"strings"
	"testing"
)

func TestParseConfigFile_RejectsBadLines(t *testing.T) {
	good, err := parseConfigFile(strings.NewReader("# c\n\nmysql-dsn = \"a=b\"\nlog-level=warn\n"))
	if err != nil || good["mysql-dsn"] != "a=b" || good["log-level"] != "warn" {
		t.Fatalf("parse = %v, %v", good, err)
	}
	for _, bad := range []string{"no equals sign", "= value", "a b = c", "x = 1\nx = 2"} {
		if _, err := parseConfigFile(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseConfigFile(%q) accepted", bad)
		}
	}
}

func FuzzParseConfigFile(f *testing.F) {
	f.Add("mysql-dsn = x\n# c\nlog-level = \"debug\"\n")
	f.Add("a=\"\nb")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseConfigFile(strings.NewReader(s))
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

func TestParseConfigFile_BadNameErrorDoesNotEchoTheLine(t *testing.T) {
	for _, line := range []string{"mysql-dsn u:S3=CRET@tcp(h)/d", "mysql-dsn:u:S3=CRET@tcp(h)/d", "MYSQL-DSN_S3=CRET", "\"S3\" = CRET"} {
		_, err := parseConfigFile(strings.NewReader("log-level = info\n" + line + "\n"))
		if err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "not a setting name") {
			t.Errorf("ParseConfigFile(%q) = %v, want a line-2 error about the name", line, err)
			continue
		}
		if strings.Contains(err.Error(), "S3") {
			t.Errorf("ParseConfigFile(%q) echoes the line: %v", line, err)
		}
	}
}
