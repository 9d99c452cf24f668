package main

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge"
)

// fileSuffix names the companion of a secret-bearing flag that reads its
// value from a file (see delaybridge.SecretFileSuffix).
const fileSuffix = delaybridge.SecretFileSuffix

// registerSecretFiles adds the -file companion of every secret flag fs has.
func registerSecretFiles(fs *pflag.FlagSet) { delaybridge.RegisterSecretFiles(fs) }

// applySecretFiles sets each secret flag of cmd whose -file companion is
// set to that file's contents (see delaybridge.ApplySecretFiles).
func applySecretFiles(cmd *cobra.Command) error { return delaybridge.ApplySecretFiles(cmd.Flags()) }

// readSecretFile returns path's contents without the trailing line break
// (see delaybridge.ReadSecretFile).
func readSecretFile(path string) (string, error) { return delaybridge.ReadSecretFile(path) }

// secretFileModeWarning says when path may be read by other users, "" when
// it may not.
func secretFileModeWarning(path string) string { return delaybridge.SecretFileModeWarning(path) }
