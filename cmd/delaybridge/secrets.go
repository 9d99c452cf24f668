package main

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/internal/settings"
)

// fileSuffix names the companion of a secret-bearing flag that reads its
// value from a file (see settings.SecretFileSuffix).
const fileSuffix = settings.SecretFileSuffix

// registerSecretFiles adds the -file companion of every secret flag fs has.
func registerSecretFiles(fs *pflag.FlagSet) { settings.RegisterSecretFiles(fs) }

// applySecretFiles sets each secret flag of cmd whose -file companion is
// set to that file's contents (see settings.ApplySecretFiles).
func applySecretFiles(cmd *cobra.Command) error { return settings.ApplySecretFiles(cmd.Flags()) }

// readSecretFile returns path's contents without the trailing line break
// (see settings.ReadSecretFile).
func readSecretFile(path string) (string, error) { return settings.ReadSecretFile(path) }

// secretFileModeWarning says when path may be read by other users, "" when
// it may not.
func secretFileModeWarning(path string) string { return settings.SecretFileModeWarning(path) }
