package settings

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/spf13/pflag"
)

// TLSFiles are the files of one TLS client setup, the --<name>-tls-ca,
// -cert, -key and -server-name settings. The zero value means no TLS.
type TLSFiles struct {
	// CA is a PEM file of the CA certificates that verify the server
	// (default: the system's).
	CA string
	// Cert and Key are PEM files of the client certificate and its key.
	Cert string
	Key  string
	// ServerName is the name the server's certificate is verified against
	// (default: the host of the address).
	ServerName string
}

// Register adds the --<name>-tls-* flags of t to fs; what names the
// server in their help.
func (t *TLSFiles) Register(fs *pflag.FlagSet, name, what string) {
	fs.StringVar(&t.CA, name+"-tls-ca", t.CA, "PEM CA certificates for "+what+" (default: the system's)")
	fs.StringVar(&t.Cert, name+"-tls-cert", t.Cert, "PEM client certificate for "+what+", with --"+name+"-tls-key")
	fs.StringVar(&t.Key, name+"-tls-key", t.Key, "PEM file of the client certificate's private key")
	fs.StringVar(&t.ServerName, name+"-tls-server-name", t.ServerName, "name "+what+"'s certificate must hold (default: its host)")
}

// On reports whether any of the files or the server name is set.
func (t TLSFiles) On() bool {
	return t.CA != "" || t.Cert != "" || t.Key != "" || t.ServerName != ""
}

// Config builds the client TLS configuration, nil when t is zero; name is
// the flag prefix its errors use (mysql, amqp). Certificates are always
// verified: there is no setting to skip that.
func (t TLSFiles) Config(name string) (*tls.Config, error) {
	if !t.On() {
		return nil, nil
	}
	if (t.Cert == "") != (t.Key == "") {
		return nil, fmt.Errorf("--%s-tls-cert and --%s-tls-key go together", name, name)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("--%s-tls-ca: %w", name, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--%s-tls-ca: no PEM certificate in %s", name, t.CA)
		}
		cfg.RootCAs = pool
	}
	if t.Cert != "" {
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("--%s-tls-cert %s / --%s-tls-key %s: %w", name, t.Cert, name, t.Key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
