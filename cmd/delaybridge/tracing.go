package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// otlpTracesURL checks an --otlp-endpoint and returns the URL spans are
// posted to: the endpoint, with OTLP's /v1/traces when it names no path.
func otlpTracesURL(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("--otlp-endpoint %q: want http(s)://host:port, with an optional path (such as http://localhost:4318)", endpoint)
	}
	if strings.Trim(u.Path, "/") == "" {
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

// startTracing returns the tracer provider --otlp-endpoint asks for and
// the function that flushes and stops it; a nil provider, and a stop that
// does nothing, when endpoint is empty. Spans are batched and exported
// over OTLP/HTTP; an export that fails is dropped and logged by
// OpenTelemetry, never waited for by the work.
func startTracing(ctx context.Context, endpoint, service, shard string) (trace.TracerProvider, func(context.Context) error, error) {
	none := func(context.Context) error { return nil }
	if endpoint == "" {
		return nil, none, nil
	}
	target, err := otlpTracesURL(endpoint)
	if err != nil {
		return nil, none, err
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(target))
	if err != nil {
		return nil, none, fmt.Errorf("--otlp-endpoint: %w", err)
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(service)}
	if shard != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(shard))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewWithAttributes(semconv.SchemaURL, attrs...)))
	return tp, tp.Shutdown, nil
}
