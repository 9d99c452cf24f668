package settings

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// RegisterDatabaseFlags adds --mysql-dsn, bound to dsn, and the
// --mysql-tls-* flags, which registerTLS adds (a TLSFiles' Register).
func RegisterDatabaseFlags(fs *pflag.FlagSet, dsn *string, registerTLS func(fs *pflag.FlagSet, name, what string)) {
	fs.StringVar(dsn, "mysql-dsn", *dsn, "MySQL/MariaDB DSN of the outbox (go-sql-driver format)")
	registerTLS(fs, "mysql", "the database")
}

// DSNForm is the DSN form of go-sql-driver/mysql, which --mysql-dsn takes.
const DSNForm = "user:password@tcp(host:3306)/dbname?param=value"

// DSNFormHint says what a DSN the driver cannot parse should look like.
// The two usual mistakes get their own words: a URL (mysql://...) and an
// address without its network (user:pw@host:3306/db), for which the
// driver only says "default addr for network 'host:3306' unknown". It
// never quotes the DSN, which holds the password.
func DSNFormHint(dsn string) string {
	if scheme, _, ok := strings.Cut(dsn, "://"); ok && !strings.ContainsAny(scheme, ":@/") {
		return fmt.Sprintf("it is a %s:// URL, want the go-sql-driver form %s", scheme, DSNForm)
	}
	if at := strings.LastIndex(dsn, "@"); at >= 0 {
		addr, _, _ := strings.Cut(dsn[at+1:], "/")
		if addr != "" && !strings.Contains(addr, "(") {
			return "the address needs its network, as in tcp(host:3306) or unix(/path/to/socket): want the go-sql-driver form " + DSNForm
		}
	}
	return "want the go-sql-driver form " + DSNForm
}
