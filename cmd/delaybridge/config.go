package main

import (
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/internal/redact"
	"github.com/delaybridge/delaybridge/internal/settings"
)

// envPrefix starts the environment variable of every flag.
const envPrefix = settings.EnvPrefix

// envName returns the environment variable that sets flag name.
func envName(name string) string { return settings.EnvName(name) }

// applyConfig fills every flag of cmd the command line did not set, first
// from its DELAYBRIDGE_* environment variable, then from the config file
// (see settings.ApplyEnvAndFileShared).
//
// One file may serve every command: a setting of another delaybridge
// command (broker = rabbit in the file migrate reads) is skipped, and only
// a name no command has is an error, so a typo is still caught.
func applyConfig(cmd *cobra.Command, file string) (holdsSecret bool, err error) {
	known := map[string]bool{}
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		visitAll(c, func(f *pflag.Flag) { known[f.Name] = true })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd.Root())
	return settings.ApplyEnvAndFileShared(cmd.Flags(), file, cmd.CommandPath(), func(name string) bool { return known[name] })
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

// redactDSN hides the password of a MySQL DSN (see redact.DSN).
func redactDSN(dsn string) string { return redact.DSN(dsn) }
