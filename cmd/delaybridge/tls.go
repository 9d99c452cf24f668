package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/spf13/pflag"
)

// tlsFlags are the files of one TLS client setup: --<name>-tls-ca, -cert,
// -key and -server-name.
type tlsFlags struct {
	name       string
	ca         string
	cert       string
	key        string
	serverName string
}

func (t *tlsFlags) register(fs *pflag.FlagSet, name, what string) {
	t.name = name
	fs.StringVar(&t.ca, name+"-tls-ca", "", "PEM file of the CA certificates that verify "+what+"'s certificate (default: the system's); setting any --"+name+"-tls-* flag turns TLS on")
	fs.StringVar(&t.cert, name+"-tls-cert", "", "PEM file of the client certificate to present to "+what+" (with --"+name+"-tls-key)")
	fs.StringVar(&t.key, name+"-tls-key", "", "PEM file of the client certificate's private key")
	fs.StringVar(&t.serverName, name+"-tls-server-name", "", "name to verify "+what+"'s certificate against (default: the host of the address)")
}

// on reports whether any of the flags is set.
func (t *tlsFlags) on() bool {
	return t.ca != "" || t.cert != "" || t.key != "" || t.serverName != ""
}

// config builds the client TLS configuration, nil when no flag is set.
// Certificates are always verified: there is no flag to skip that.
func (t *tlsFlags) config() (*tls.Config, error) {
	if !t.on() {
		return nil, nil
	}
	if (t.cert == "") != (t.key == "") {
		return nil, fmt.Errorf("--%s-tls-cert and --%s-tls-key go together", t.name, t.name)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.serverName}
	if t.ca != "" {
		pem, err := os.ReadFile(t.ca)
		if err != nil {
			return nil, fmt.Errorf("--%s-tls-ca: %w", t.name, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--%s-tls-ca: no PEM certificate in %s", t.name, t.ca)
		}
		cfg.RootCAs = pool
	}
	if t.cert != "" {
		pair, err := tls.LoadX509KeyPair(t.cert, t.key)
		if err != nil {
			return nil, fmt.Errorf("--%s-tls-cert %s / --%s-tls-key %s: %w", t.name, t.cert, t.name, t.key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
