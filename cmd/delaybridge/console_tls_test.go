package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/internal/testutil"
)

// A key pair that cannot be loaded is an error naming the flag and the
// file, before the console listens or says it serves; one that loads is
// the certificate the console serves, even once its files are gone.
func TestConsoleCmd_LoadsTheTLSKeyPairBeforeItListens(t *testing.T) {
	testenv.SkipIfShort(t, "needs MariaDB")
	dsn := scratch(t)
	auth := writeAuthFile(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	served := testenv.WriteServerCert(t, cert, key)
	otherKey := filepath.Join(dir, "other-key.pem")
	testenv.WriteServerCert(t, filepath.Join(dir, "other-cert.pem"), otherKey)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	base := []string{"console", "--mysql-dsn", dsn, "--auth-file", auth}

	for _, tc := range []struct {
		name      string
		cert, key string
		want      []string
	}{
		{"missing certificate", missing, key, []string{"--tls-cert " + missing, "no such file"}},
		{"missing key", cert, missing, []string{"--tls-key " + missing, "no such file"}},
		{"certificate not PEM", notPEM, key, []string{"--tls-cert " + notPEM, "certificate input"}},
		{"key of another certificate", cert, otherKey, []string{"--tls-cert " + cert, "--tls-key " + otherKey, "does not match"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := run(t, append(base, "--listen", "127.0.0.1:0", "--tls-cert", tc.cert, "--tls-key", tc.key)...)
			if err == nil {
				t.Fatalf("console started: %s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err %q, want it to contain %q", err, w)
				}
			}
			if strings.Contains(out, "console on") {
				t.Errorf("the console said it serves before the key pair was loaded: %q", out)
			}
		})
	}

	addr := testenv.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	root := newRootCmd()
	root.SetArgs(append(base, "--listen", addr, "--tls-cert", cert, "--tls-key", key))
	root.SetOut(&out)
	root.SetErr(&errOut)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	if !testutil.Eventually(30*time.Second, 50*time.Millisecond, func() bool {
		select {
		case err := <-done:
			t.Fatalf("console ended before it started: %v\n%s", err, errOut.String())
		default:
		}
		return strings.Contains(out.String(), "delaybridge console on https://"+addr+"/")
	}) {
		t.Fatalf("console did not start:\n%s\n%s", out.String(), errOut.String())
	}
	for _, p := range []string{cert, key} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	roots := x509.NewCertPool()
	roots.AddCert(served)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("ops", testConsolePassword)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET over TLS: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 || !bytes.Equal(resp.TLS.PeerCertificates[0].Raw, served.Raw) {
		t.Errorf("GET over TLS: %d, not the certificate of --tls-cert", resp.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
