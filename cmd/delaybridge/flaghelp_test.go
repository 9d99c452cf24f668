package main

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// maxFlagHelp is the most characters a flag's help may have. The help says
// what the flag is; the explanation lives in docs/.
const maxFlagHelp = 100

// Every flag of every command, local, persistent and hidden ones
// included, has a help of one line of at most maxFlagHelp characters,
// counting the default --help prints after it.
func TestFlagHelp_EveryFlagHasOneShortLine(t *testing.T) {
	t.Parallel()
	seen := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.InitDefaultHelpFlag()
		check := func(f *pflag.Flag) {
			seen++
			key := c.CommandPath() + " --" + f.Name
			if strings.ContainsAny(f.Usage, "\r\n") {
				t.Errorf("%s: help holds a line break: %q", key, f.Usage)
			}
			// The line --help prints: the help, then pflag's default.
			line := f.Usage
			if d := f.DefValue; d != "" && d != "0" && d != "false" && d != "0s" && d != "[]" {
				if f.Value.Type() == "string" {
					d = strconv.Quote(d)
				}
				line += " (default " + d + ")"
			}
			if n := utf8.RuneCountInString(line); n > maxFlagHelp {
				t.Errorf("%s: help with its default is %d characters, more than %d; say what it is in one line and explain in docs/:\n%s",
					key, n, maxFlagHelp, line)
			}
		}
		// LocalFlags holds the command's own flags, persistent and hidden
		// ones included; inherited ones are checked on their parent.
		c.LocalFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	if seen < 100 {
		t.Fatalf("checked only %d flags; the walk misses commands", seen)
	}
}

// docs/flags.md explains what the one-line helps leave out; every flag it
// names is a flag of some command, so a renamed or removed flag cannot
// leave it behind.
func TestFlagHelp_DocsNameOnlyRealFlags(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.InitDefaultHelpFlag()
		c.LocalFlags().VisitAll(func(f *pflag.Flag) { flags[f.Name] = true })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	named := regexp.MustCompile("`--([a-z0-9-]+)").FindAllSubmatch(doc, -1)
	if len(named) < 50 {
		t.Fatalf("docs/flags.md names only %d flags; the pattern misses them", len(named))
	}
	for _, m := range named {
		name := string(m[1])
		if prefix, ok := strings.CutSuffix(name, "-"); ok { // --mysql-tls-*
			if !slices.ContainsFunc(slices.Collect(maps.Keys(flags)), func(f string) bool { return strings.HasPrefix(f, prefix+"-") }) {
				t.Errorf("docs/flags.md names --%s*, which matches no flag", name)
			}
			continue
		}
		if !flags[name] {
			t.Errorf("docs/flags.md names --%s, which no command has", name)
		}
	}
}
