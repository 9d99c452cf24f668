package delaybridge

import (
	"io"

	"github.com/spf13/pflag"

	"github.com/delaybridge/delaybridge/internal/settings"
)

// LoadFlags parses args into fs, then fills what args did not set from
// its DELAYBRIDGE_* environment variable, then from the config file, then
// reads the -file companions of the secret settings (--mysql-dsn-file and
// the like). Command line beats environment beats file beats default. The
// config file is the one --config names when fs has that flag, else
// DELAYBRIDGE_CONFIG's. who names the program in errors. A service that
// has flags of its own registers them and Config.RegisterFlags on one
// FlagSet and calls LoadFlags once.
func LoadFlags(fs *pflag.FlagSet, args []string, who string) error {
	return settings.LoadFlags(fs, args, who)
}

// LoadConfig returns the configuration args (a command line without the
// program name, e.g. os.Args[1:]), the DELAYBRIDGE_* environment and the
// config file (--config or DELAYBRIDGE_CONFIG) give, read as the
// delaybridge binary reads them. Settings none of them give keep
// DefaultConfig's values.
func LoadConfig(args []string) (Config, error) {
	cfg := DefaultConfig()
	fs := pflag.NewFlagSet("delaybridge", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.String("config", "", "config file of name = value lines (env DELAYBRIDGE_CONFIG)")
	cfg.RegisterFlags(fs)
	if err := settings.LoadFlags(fs, args, "delaybridge.LoadConfig"); err != nil {
		return Config{}, err
	}
	return cfg, nil
}
