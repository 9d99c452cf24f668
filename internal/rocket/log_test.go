package rocket

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

func TestRouteClientLogs_SendsClientLogsAtOrAboveTheLevelToSlog(t *testing.T) {
	defer RouteClientLogs(slog.Default(), slog.LevelError)
	var buf bytes.Buffer
	RouteClientLogs(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), slog.LevelWarn)
	a := rlogAdapter{}
	a.Info("rebalance done", map[string]interface{}{"topic": "t"})
	a.Warning("pull failed", map[string]interface{}{"underlayError": errors.New("boom"), "broker": "b1"})
	a.Fatal("fatal stays an error", nil)
	out := buf.String()
	if strings.Contains(out, "rebalance done") {
		t.Errorf("an Info line passed a Warn threshold:\n%s", out)
	}
	for _, want := range []string{"level=WARN", "pull failed", "underlayError=boom", "broker=b1", "component=rocketmq-client", "level=ERROR", "fatal stays an error"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
