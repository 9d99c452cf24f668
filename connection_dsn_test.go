package delaybridge_test

import (
	"context"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge"
)

// A DSN in another form than go-sql-driver's, a URL or an address
// without tcp(...), is refused with the form it should take, never with
// the driver's "default addr for network ... unknown" alone, and never
// showing the password.
func TestOpenDB_ADSNInAnotherFormSaysTheFormWanted(t *testing.T) {
	const password = "S3cret-Pa55word"
	for dsn, want := range map[string]string{
		"user:" + password + "@127.0.0.1:3306/db":         "the address needs its network, as in tcp(host:3306)",
		"user:" + password + "@localhost/db":              "the address needs its network, as in tcp(host:3306)",
		"mysql://user:" + password + "@127.0.0.1:3306/db": "it is a mysql:// URL",
		"user:" + password + "@tcp(127.0.0.1:3306)db":     "want the go-sql-driver form",
	} {
		shown := strings.ReplaceAll(dsn, password, "PW")
		_, err := delaybridge.Config{MySQLDSN: dsn}.OpenDB(context.Background())
		if err == nil {
			t.Fatalf("OpenDB with %s succeeded", shown)
		}
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "user:password@tcp(host:3306)/dbname") {
			t.Errorf("OpenDB with %s: %v, want %q and the form user:password@tcp(host:3306)/dbname", shown, err, want)
		}
		if strings.Contains(err.Error(), password) {
			t.Errorf("the error shows the password: %v", err)
		}
	}
}
