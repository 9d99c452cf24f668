package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envPrefix starts the environment variable of every flag: --mysql-dsn is
// DELAYBRIDGE_MYSQL_DSN.
const envPrefix = "DELAYBRIDGE_"

// envName returns the environment variable that sets flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// parseConfigFile reads a config file: one "name = value" per line, name
// being a flag name without dashes, '#' starting a comment line. Values may
// be wrapped in double quotes. It rejects unknown syntax with the line
// number.
func parseConfigFile(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: want name = value", n)
		}
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !validSettingName(name) {
			// Not quoted: a line such as "mysql-dsn u:pa=ss@…" has part
			// of a password before its '='.
			return nil, fmt.Errorf("line %d: the text before '=' is not a setting name (lower-case letters, digits, '-'); the line is not shown as it may hold a secret", n)
		}
		if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
			value = value[1 : len(value)-1]
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("line %d: %s set twice", n, name)
		}
		out[name] = value
	}
	return out, sc.Err()
}

// validSettingName accepts what a flag name can be, lower-case letters,
// digits and '-' after a letter, and '_' so that mysql_dsn is reported as an
// unknown setting rather than as an unreadable line.
func validSettingName(name string) bool {
	if name == "" || name[0] < 'a' || name[0] > 'z' {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// applyConfig fills every flag of cmd the command line did not set, first
// from its DELAYBRIDGE_* environment variable, then from the config file.
// Command line beats environment beats file beats default. holdsSecret
// says whether the file sets a secret flag itself (not its -file twin).
func applyConfig(cmd *cobra.Command, file string) (holdsSecret bool, err error) {
	var fromFile map[string]string
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return false, fmt.Errorf("config file: %w", err)
		}
		defer f.Close()
		if fromFile, err = parseConfigFile(f); err != nil {
			return false, fmt.Errorf("config file %s: %w", file, err)
		}
		known := map[string]bool{}
		cmd.Root().PersistentFlags().VisitAll(func(f *pflag.Flag) { known[f.Name] = true })
		visitAll(cmd, func(f *pflag.Flag) { known[f.Name] = true })
		for name := range fromFile {
			if !known[name] {
				return false, fmt.Errorf("config file %s: unknown setting %q for %s", file, name, cmd.CommandPath())
			}
			holdsSecret = holdsSecret || isSecretFlag(name)
		}
	}
	visitAll(cmd, func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		// A value from the environment or the file counts as set, like one
		// from the command line: applySecretFiles relies on it.
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s: %w", envName(f.Name), e)
			}
			f.Changed = true
			return
		}
		if v, ok := fromFile[f.Name]; ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("config file %s: %s: %w", file, f.Name, e)
			}
			f.Changed = true
		}
	})
	return holdsSecret, err
}

// noteConfigFile logs what an operator should know about the config file
// it read. A symbolic link is followed, as orchestrators mount files
// through them (a Kubernetes ConfigMap's file is one), but never silently:
// the log names the file actually read. A file that holds a secret and is
// readable by group or others gets the warning a secret file gets; one that
// holds only paths to secret files does not need it.
func (a *app) noteConfigFile(file string, holdsSecret bool) {
	if st, err := os.Lstat(file); err == nil && st.Mode()&os.ModeSymlink != 0 {
		target, err := filepath.EvalSymlinks(file)
		if err != nil {
			target = "(unresolvable: " + err.Error() + ")"
		}
		a.log.Info("delaybridge: config file is a symbolic link; read its target", "config", file, "target", target)
	}
	if holdsSecret {
		if w := secretFileModeWarning(file); w != "" {
			a.log.Warn("delaybridge: config file holds a secret and "+w+", or move the secret to a -file setting", "config", file)
		}
	}
}

func visitAll(cmd *cobra.Command, fn func(*pflag.Flag)) {
	seen := map[string]bool{}
	each := func(f *pflag.Flag) {
		if !seen[f.Name] {
			seen[f.Name] = true
			fn(f)
		}
	}
	cmd.LocalFlags().VisitAll(each)
	cmd.InheritedFlags().VisitAll(each)
}

// redactDSN hides the password of a MySQL DSN for logs and errors.
func redactDSN(dsn string) string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "(unparseable DSN)"
	}
	if cfg.Passwd != "" {
		cfg.Passwd = "xxxxx"
	}
	return cfg.FormatDSN()
}
