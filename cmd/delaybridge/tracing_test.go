package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/delaybridge/delaybridge/internal/outbox"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

func TestOTLPTracesURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"http://localhost:4318":            "http://localhost:4318/v1/traces",
		"http://localhost:4318/":           "http://localhost:4318/v1/traces",
		"https://otel.example:4318/custom": "https://otel.example:4318/custom",
	} {
		if got, err := otlpTracesURL(in); err != nil || got != want {
			t.Errorf("otlpTracesURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"localhost:4318", "grpc://localhost:4317", "http://", "http://u:secret@h:4318", "http://h:4318/?x=1", "::"} {
		if _, err := otlpTracesURL(bad); err == nil || !strings.Contains(err.Error(), "--otlp-endpoint") {
			t.Errorf("otlpTracesURL(%q) = %v, want an error naming --otlp-endpoint", bad, err)
		}
	}
}

// A bad --otlp-endpoint stops run before it connects to anything.
func TestRun_RefusesABadOTLPEndpointBeforeConnecting(t *testing.T) {
	t.Parallel()
	_, _, err := run(t, "run", "--mysql-dsn", "u:p@tcp(127.0.0.1:1)/db", "--broker", "rabbit", "--amqp-url", "amqp://u:p@127.0.0.1:1/",
		"--http", "127.0.0.1:0", "--otlp-endpoint", "localhost:4318")
	if err == nil || !strings.Contains(err.Error(), "--otlp-endpoint") {
		t.Fatalf("run with --otlp-endpoint localhost:4318: %v, want it refused by name", err)
	}
}

// otlpSink is an OTLP/HTTP endpoint that keeps the spans posted to it,
// decoded with OTLP's own protobuf types.
type otlpSink struct {
	mu    sync.Mutex
	spans []*tracepb.Span
	names map[string]string // span name -> service.name
}

func (s *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req coltrace.ExportTraceServiceRequest
	if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				s.spans = append(s.spans, sp)
				s.names[sp.Name] = service
			}
		}
	}
	resp, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(resp)
}

// runTraced schedules a task due now with a trace of its own, runs
// delaybridge run with --otlp-endpoint endpoint until the task is
// published, stops it, and returns the topic and the trace id.
func runTraced(t *testing.T, endpoint string) (topic, traceID string) {
	t.Helper()
	dsn := scratch(t)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		t.Fatal(err)
	}
	traceID, topic = hex.EncodeToString(id), testenv.Name("otlp")
	if _, err := outbox.Schedule(context.Background(), db, outbox.Task{Topic: topic, Key: "o1", DueAt: time.Now(),
		Trace: "00-" + traceID + "-00f067aa0ba902b7-01"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := runContext(ctx, append([]string{"run", "--mysql-dsn", dsn, "--http", testenv.FreeAddr(t), "--log-level", "error",
			"--otlp-endpoint", endpoint}, testenv.RabbitFlags(t)...)...)
		done <- err
	}()
	var state string
	for end := time.Now().Add(30 * time.Second); state != "published" && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		_ = db.QueryRow("SELECT state FROM delay_task WHERE topic = ? AND task_key = 'o1'", topic).Scan(&state)
	}
	if state != "published" {
		t.Fatalf("the task is %q after 30 s, want published", state)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	return topic, traceID
}

// run --otlp-endpoint exports the relay's span of each task it publishes,
// linked to the trace the task was scheduled in, and flushes on shutdown.
func TestRun_ExportsTheRelaysSpansOverOTLP(t *testing.T) {
	sink := &otlpSink{names: map[string]string{}}
	srv := httptest.NewServer(sink)
	defer srv.Close()
	topic, traceID := runTraced(t, srv.URL)
	// Stopping flushed the batch.
	sink.mu.Lock()
	defer sink.mu.Unlock()
	var send *tracepb.Span
	for _, sp := range sink.spans {
		if sp.Name == "send "+topic {
			send = sp
		}
	}
	if send == nil {
		t.Fatalf("no span %q among %d exported", "send "+topic, len(sink.spans))
	}
	if sink.names[send.Name] != "delaybridge" {
		t.Errorf("service.name %q, want delaybridge", sink.names[send.Name])
	}
	if len(send.Links) != 1 || hex.EncodeToString(send.Links[0].TraceId) != traceID {
		t.Errorf("send span links %v, want one to trace %s", send.Links, traceID)
	}
	if send.Kind != tracepb.Span_SPAN_KIND_PRODUCER {
		t.Errorf("send span kind %v, want producer", send.Kind)
	}
}

// The same export reaches a real OpenTelemetry Collector (the one
// scripts/services.sh builds and starts), whose debug exporter writes
// the span, its link and its attributes to the collector's log.
func TestRun_ExportsToTheCollector(t *testing.T) {
	endpoint, logFile := testenv.Collector(t)
	topic, traceID := runTraced(t, endpoint)
	name := regexp.MustCompile(`Name\s*:\s*send ` + regexp.QuoteMeta(topic) + `\b`)
	var log []byte
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		b, err := os.ReadFile(logFile)
		if err != nil {
			t.Fatal(err)
		}
		if loc := name.FindIndex(b); loc != nil {
			log = b[loc[0]:]
			break
		}
	}
	if log == nil {
		t.Fatalf("the collector's log %s names no span %q after 30 s", logFile, "send "+topic)
	}
	// The span's own lines come before the next span's or batch's.
	if i := bytes.Index(log[1:], []byte("Span #")); i >= 0 {
		log = log[:i+1]
	}
	for _, want := range []string{"Producer", traceID, "rabbitmq", "delaybridge.key"} {
		if !bytes.Contains(log, []byte(want)) {
			t.Errorf("the collector's record of the span lacks %q:\n%s", want, log)
		}
	}
}
