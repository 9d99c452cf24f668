package rocket

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/apache/rocketmq-client-go/v2/rlog"
)

// rocketmq-client-go logs through one process-wide logger (rlog), by default
// logrus at Info on stderr: a line for every rebalance, heartbeat and pull
// hiccup. The adapter below replaces it once, before the first client
// starts, and forwards to whatever RouteClientLogs last chose. The target
// sits behind an atomic pointer because the client's goroutines read the
// logger while RouteClientLogs may change it, and rlog.SetLogger itself is
// not safe to call while clients run.
var (
	clientLogOnce   sync.Once
	clientLogTarget atomic.Pointer[clientLog]
)

type clientLog struct {
	l   *slog.Logger
	min slog.Level
}

// RouteClientLogs sends rocketmq-client-go's logs at min and above to l,
// tagged component=rocketmq-client. Until it is called, the package routes
// them to slog.Default() at slog.LevelError, so the client is quiet unless
// something is wrong. The setting is process-wide, like the client's logger;
// it may be changed at any time.
func RouteClientLogs(l *slog.Logger, min slog.Level) {
	if l == nil {
		l = slog.Default()
	}
	clientLogTarget.Store(&clientLog{l: l.With("component", "rocketmq-client"), min: min})
	installClientLog()
}

// installClientLog puts the adapter in place, once, before any client of
// this package is created.
func installClientLog() {
	clientLogOnce.Do(func() {
		clientLogTarget.CompareAndSwap(nil, &clientLog{l: slog.Default().With("component", "rocketmq-client"), min: slog.LevelError})
		rlog.SetLogger(rlogAdapter{})
	})
}

// rlogAdapter implements rlog.Logger on top of slog.
type rlogAdapter struct{}

func (rlogAdapter) log(level slog.Level, msg string, fields map[string]interface{}) {
	t := clientLogTarget.Load()
	if t == nil || level < t.min || (msg == "" && len(fields) == 0) {
		return
	}
	if !t.l.Enabled(context.Background(), level) {
		return
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	attrs := make([]any, 0, len(keys))
	for _, k := range keys {
		v := fields[k]
		if err, ok := v.(error); ok {
			v = err.Error()
		} else if s, ok := v.(fmt.Stringer); ok {
			v = s.String()
		}
		attrs = append(attrs, slog.Any(k, v))
	}
	t.l.Log(context.Background(), level, strings.TrimSpace(msg), attrs...)
}

func (a rlogAdapter) Debug(msg string, fields map[string]interface{}) {
	a.log(slog.LevelDebug, msg, fields)
}

func (a rlogAdapter) Info(msg string, fields map[string]interface{}) {
	a.log(slog.LevelInfo, msg, fields)
}

func (a rlogAdapter) Warning(msg string, fields map[string]interface{}) {
	a.log(slog.LevelWarn, msg, fields)
}

func (a rlogAdapter) Error(msg string, fields map[string]interface{}) {
	a.log(slog.LevelError, msg, fields)
}

// Fatal logs at error level: the client calls it where logrus would exit
// the process, which a library must never do.
func (a rlogAdapter) Fatal(msg string, fields map[string]interface{}) {
	a.log(slog.LevelError, msg, fields)
}

// Level is how the client's own rlog.SetLogLevel reaches the adapter; the
// level is RouteClientLogs' business, so it is ignored.
func (rlogAdapter) Level(string) {}

// OutputPath is ignored: the output is the slog handler's.
func (rlogAdapter) OutputPath(string) error { return nil }
