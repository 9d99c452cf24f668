package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// fileSuffix names the companion of a secret-bearing flag that reads its
// value from a file: --mysql-dsn-file for --mysql-dsn. Like every flag it
// has an environment variable (DELAYBRIDGE_MYSQL_DSN_FILE) and a config
// file name (mysql-dsn-file), so a secret can live in a file mounted by the
// orchestrator while the config file and the environment hold only its path.
const fileSuffix = "-file"

// secretFlags are the flags whose values may carry a password or a key.
// Each has a -file companion, and their values are scrubbed from errors.
var secretFlags = []string{"mysql-dsn", "amqp-url", "rocketmq-secret-key", "signing-keys"}

// maxSecretFile bounds what a secret file may hold; a DSN or key is short,
// so anything bigger is a wrong path, not a secret.
const maxSecretFile = 64 << 10

// registerSecretFiles adds the -file companion of every secret flag fs has.
func registerSecretFiles(fs *pflag.FlagSet) {
	for _, name := range secretFlags {
		if f := fs.Lookup(name); f != nil && fs.Lookup(name+fileSuffix) == nil {
			fs.String(name+fileSuffix, "", "read --"+name+" from this file (one line; trailing newline ignored)")
		}
	}
}

// applySecretFiles sets each secret flag of cmd whose -file companion is
// set to that file's contents. Setting both a flag and its file, by any
// means, is an error: one of them would be silently ignored. Errors name
// the file, never its contents.
func applySecretFiles(cmd *cobra.Command) error {
	var err error
	visitAll(cmd, func(f *pflag.Flag) {
		base, ok := strings.CutSuffix(f.Name, fileSuffix)
		if err != nil || !ok || !isSecretFlag(base) || f.Value.String() == "" {
			return
		}
		target := cmd.Flags().Lookup(base)
		if target == nil {
			return
		}
		if target.Changed && target.Value.String() != "" {
			err = fmt.Errorf("--%s and --%s are both set (flag, %s or config file); set one", base, f.Name, envName(base))
			return
		}
		v, e := readSecretFile(f.Value.String())
		if e != nil {
			err = fmt.Errorf("--%s: %w", f.Name, e)
			return
		}
		if e := target.Value.Set(v); e != nil {
			err = fmt.Errorf("--%s: the value in %s is not valid for --%s", f.Name, f.Value.String(), base)
			return
		}
		target.Changed = true
	})
	return err
}

func isSecretFlag(name string) bool {
	for _, s := range secretFlags {
		if s == name {
			return true
		}
	}
	return false
}

// readSecretFile returns path's contents without the trailing line break.
// It refuses an empty file and one of several lines, which is most likely
// the wrong file; the error never quotes the contents.
func readSecretFile(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > maxSecretFile {
		return "", fmt.Errorf("%s is %d bytes, more than a secret (limit %d)", path, st.Size(), maxSecretFile)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	b = bytes.TrimRight(b, "\r\n")
	switch {
	case len(bytes.TrimSpace(b)) == 0:
		return "", fmt.Errorf("%s is empty", path)
	case bytes.ContainsAny(b, "\r\n"):
		return "", fmt.Errorf("%s has more than one line; it must hold the value alone", path)
	}
	return string(b), nil
}

// secretFileModeWarning says when path may be read by other users, "" when
// it may not.
func secretFileModeWarning(path string) string {
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm()&0o077 == 0 {
		return ""
	}
	return fmt.Sprintf("%s is readable by group or others (mode %04o); chmod 600 it", path, st.Mode().Perm())
}
