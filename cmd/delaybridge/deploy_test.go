package main

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// metricSources are the files that name the series a delaybridge process
// exports: the library's (delaybridge.Metrics) and the daemon's collectors.
var metricSources = []string{"../../metrics.go", "metrics.go", "topology.go"}

// exportedMetrics returns the metric names metricSources register.
func exportedMetrics(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, f := range metricSources {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`"(delaybridge_[a-z_]+)"`).FindAllStringSubmatch(string(src), -1) {
			names = append(names, m[1])
		}
	}
	if len(names) < 10 {
		t.Fatalf("found only %v in %v", names, metricSources)
	}
	return names
}

// checkMetricNames fails for every delaybridge_ series in expr that
// metricSources do not export (a histogram's _bucket, _sum and _count count
// as its own).
func checkMetricNames(t *testing.T, where, expr string, known []string) int {
	t.Helper()
	n := 0
	for _, name := range regexp.MustCompile(`delaybridge_[a-z_]+`).FindAllString(expr, -1) {
		n++
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && slices.Contains(known, b) {
				base = b
			}
		}
		if !slices.Contains(known, base) {
			t.Errorf("%s: %s is not a metric delaybridge exports", where, name)
		}
	}
	return n
}

func TestDeploy_GrafanaDashboardUsesOnlyExportedMetrics(t *testing.T) {
	known := exportedMetrics(t)
	raw, err := os.ReadFile("../../deploy/grafana/delaybridge.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	n := 0
	for _, e := range exprs {
		n += checkMetricNames(t, "dashboard", e, known)
	}
	if n < 15 {
		t.Fatalf("the dashboard's queries name only %d series", n)
	}
}

func TestDeploy_AlertRulesUseOnlyExportedMetrics(t *testing.T) {
	known := exportedMetrics(t)
	raw, err := os.ReadFile("../../deploy/prometheus/delaybridge.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	// Each expr runs from its "expr:" line to the rule's next key.
	var exprs []string
	in := false
	for _, line := range strings.Split(string(raw), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "expr:"):
			in = true
			exprs = append(exprs, strings.TrimPrefix(trimmed, "expr:"))
		case in && regexp.MustCompile(`^[a-z_]+:`).MatchString(trimmed):
			in = false
		case in:
			exprs[len(exprs)-1] += " " + trimmed
		}
	}
	if len(exprs) < 5 {
		t.Fatalf("found %d alert expressions", len(exprs))
	}
	for _, e := range exprs {
		if checkMetricNames(t, "rules", e, known) == 0 {
			t.Errorf("expression %q names no delaybridge series", e)
		}
	}
}
