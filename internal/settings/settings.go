// Package settings is the configuration loader the delaybridge binary and
// the root package's LoadConfig share: every setting is a flag, and a flag
// the command line did not set is read from its DELAYBRIDGE_* environment
// variable, then from the config file. Command line beats environment
// beats file beats default. Secret settings also read from a -file twin.
package settings

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// EnvPrefix starts the environment variable of every setting: --mysql-dsn
// is DELAYBRIDGE_MYSQL_DSN.
const EnvPrefix = "DELAYBRIDGE_"

// EnvName returns the environment variable that sets the flag name.
func EnvName(name string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// SecretFileSuffix names the companion of a secret-bearing flag that reads
// its value from a file: --mysql-dsn-file for --mysql-dsn. Like every flag
// it has an environment variable (DELAYBRIDGE_MYSQL_DSN_FILE) and a config
// file name (mysql-dsn-file), so a secret can live in a file mounted by the
// orchestrator while the config file and the environment hold only its
// path.
const SecretFileSuffix = "-file"

// secretSettings are the flags whose values may carry a password or a key.
// Each has a -file companion, and their values are scrubbed from errors.
func secretSettings() []string {
	return []string{"mysql-dsn", "amqp-url", "rocketmq-secret-key", "signing-keys"}
}

// MaxSecretFile bounds what a secret file may hold, in bytes; a DSN or key is short,
// so anything bigger is a wrong path, not a secret.
const MaxSecretFile = 64 << 10

// isSecretSetting reports whether the flag name may hold a password or a
// key (and so has a -file companion).
func isSecretSetting(name string) bool {
	return slices.Contains(secretSettings(), name)
}

// RegisterSecretFiles adds the -file companion of every secret flag fs
// has.
func RegisterSecretFiles(fs *pflag.FlagSet) {
	for _, name := range secretSettings() {
		if f := fs.Lookup(name); f != nil && fs.Lookup(name+SecretFileSuffix) == nil {
			fs.String(name+SecretFileSuffix, "", "read --"+name+" from this file (one line)")
		}
	}
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

// applyEnvAndFile fills every flag of fs the command line did not set,
// first from its DELAYBRIDGE_* environment variable, then from the config
// file (none when file is ""). A setting in the file that fs does not have
// is an error naming who, the program or command reading it. holdsSecret
// says whether the file sets a secret flag itself (not its -file twin).
func applyEnvAndFile(fs *pflag.FlagSet, file, who string) (holdsSecret bool, err error) {
	return ApplyEnvAndFileShared(fs, file, who, nil)
}

// ApplyEnvAndFileShared is applyEnvAndFile for a config file several
// programs or commands share: a setting fs lacks that known reports as
// another one's is skipped, not refused, while a name known does not
// report (a typo) is still an error. known nil shares nothing.
func ApplyEnvAndFileShared(fs *pflag.FlagSet, file, who string, known func(name string) bool) (holdsSecret bool, err error) {
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
		if _, ok := fromFile["config"]; ok {
			// Read only after this file, it would be ignored.
			return false, fmt.Errorf("config file %s: a config file cannot name another (config = ...): put those settings in this one", file)
		}
		for name := range fromFile {
			if fs.Lookup(name) == nil {
				if known != nil && known(name) {
					continue // another command's: this one has no use for it
				}
				return false, fmt.Errorf("config file %s: unknown setting %q for %s", file, name, who)
			}
			holdsSecret = holdsSecret || isSecretSetting(name)
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		// A value from the environment or the file counts as set, like one
		// from the command line: ApplySecretFiles relies on it.
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s: %w", EnvName(f.Name), e)
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

// ApplySecretFiles sets each secret flag of fs whose -file companion is set
// to that file's contents. Setting both a flag and its file, by any means,
// is an error: one of them would be silently ignored. Errors name the file,
// never its contents.
func ApplySecretFiles(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		base, ok := strings.CutSuffix(f.Name, SecretFileSuffix)
		if err != nil || !ok || !isSecretSetting(base) || f.Value.String() == "" {
			return
		}
		target := fs.Lookup(base)
		if target == nil {
			return
		}
		if target.Changed && target.Value.String() != "" {
			err = fmt.Errorf("--%s and --%s are both set (flag, %s or config file); set one", base, f.Name, EnvName(base))
			return
		}
		v, e := ReadSecretFile(f.Value.String())
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

// ReadSecretFile returns path's contents without the trailing line break.
// It refuses an empty file and one of several lines, which is most likely
// the wrong file; the error never quotes the contents.
func ReadSecretFile(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > MaxSecretFile {
		return "", fmt.Errorf("%s is %d bytes, more than a secret (limit %d)", path, st.Size(), MaxSecretFile)
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

// SecretFileModeWarning says when path may be read by other users, ""
// when it may not.
func SecretFileModeWarning(path string) string {
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm()&0o077 == 0 {
		return ""
	}
	return fmt.Sprintf("%s is readable by group or others (mode %04o); chmod 600 it", path, st.Mode().Perm())
}

// LoadFlags parses args into fs, then fills what args did not set from
// the environment and the config file, then reads the -file companions of
// the secret settings. The config file is the one --config names when fs
// has that flag, else DELAYBRIDGE_CONFIG's. who names the program in
// errors. The root package's LoadFlags and LoadConfig call it.
func LoadFlags(fs *pflag.FlagSet, args []string, who string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	file := os.Getenv(EnvName("config"))
	if f := fs.Lookup("config"); f != nil && f.Changed {
		file = f.Value.String()
	}
	if _, err := applyEnvAndFile(fs, file, who); err != nil {
		return err
	}
	return ApplySecretFiles(fs)
}
