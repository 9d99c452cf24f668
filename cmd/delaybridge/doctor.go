package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/driver"
)

// doctorTopic is where doctor's probes travel.
const doctorTopic = "delaybridge-doctor"

// report collects doctor's findings: printed to a.stdout as they come,
// and kept in checks for the console's brokers page.
type report struct {
	a      *app
	failed int
	warned int
	// scope starts every line: "shard NAME: " while a shard is checked.
	scope  string
	checks []doctorCheck
}

// doctorCheck is one finding: OK, WARN or FAIL and what it says.
type doctorCheck struct {
	Level string
	Text  string
}

func (r *report) add(level, format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	text = r.scope + text
	r.checks = append(r.checks, doctorCheck{Level: level, Text: text})
	fmt.Fprintf(r.a.stdout, "%-6s%s\n", level, text)
}

func (r *report) ok(format string, args ...any) { r.add("OK", format, args...) }

func (r *report) warn(format string, args ...any) {
	r.warned++
	r.add("WARN", format, args...)
}

func (r *report) fail(format string, args ...any) {
	r.failed++
	r.add("FAIL", format, args...)
}

func newDoctorCmd(a *app) *cobra.Command {
	var bf brokerFlags
	var sf shardFlags
	var probe time.Duration
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the database and the broker against delaybridge's configuration",
		Long: `doctor checks, in plain words, what delaybridge needs from the live services:
the database version supports SKIP LOCKED, the outbox schema is migrated, and
its clock agrees with this host; for RabbitMQ, the server version, quorum
queues with at-least-once dead-lettering, whether the delayed-message plugin
is present (and, in delayed-exchange mode, what it does not promise), and
whether the ladder topology of --rabbit-prefix is in place
with the configured depth; for RocketMQ, the brokers' timerWheelEnable,
timerMaxDelaySec, timerPrecisionMs and messageDelayLevel (read through the admin
API, as run reads them) against --rocketmq-max-delay, --rocketmq-precision and
--rocketmq-levels, that the broker accepts a hop of the max hop and refuses one
just past it
(probes that stay in the broker's timer store until then, on the topic
delaybridge-doctor), and the measured delivery precision of a short probe.
With --shard NAME=DSN (repeated), the database checks run on every outbox
shard, each line naming its shard. Every line starts with OK, WARN or FAIL;
the exit code is 1 when any check failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Checked before any check runs: a bad delay creates no probe
			// topic and publishes no probe.
			if err := cli.CheckProbeDelay(probe); err != nil {
				return err
			}
			r := runDoctor(cmd.Context(), a, &bf, &sf, probe)
			fmt.Fprintf(a.stdout, "%d failed, %d warnings\n", r.failed, r.warned)
			if r.failed > 0 {
				return fmt.Errorf("doctor: %d check(s) failed", r.failed)
			}
			return nil
		},
	}
	bf.register(cmd.Flags())
	sf.register(cmd.Flags())
	cmd.Flags().DurationVar(&probe, "probe-delay", 2*time.Second, "delay of the precision probe (more than 0)")
	return cmd
}

// runDoctor runs every check of the database and the broker bf names.
func runDoctor(ctx context.Context, a *app, bf *brokerFlags, sf *shardFlags, probe time.Duration) *report {
	r := &report{a: a}
	for _, w := range bf.warnings() {
		r.warn("%s", w)
	}
	checkSigningKeys(bf, r)
	if err := a.eachShard(ctx, sf, func(ctx context.Context, name string) error {
		if name != "" {
			r.scope = "shard " + name + ": "
		}
		checkDatabase(ctx, a, r)
		r.scope = ""
		return nil
	}); err != nil {
		r.fail("%v", err)
	}
	switch bf.Broker {
	case "rabbit":
		checkRabbit(ctx, a, bf, r)
	case "rocket":
		checkRocket(ctx, a, bf, r, probe)
	default:
		r.fail("--broker %q: want rabbit or rocket", bf.Broker)
	}
	return r
}

// checkSigningKeys parses --signing-keys as run does (Config.Keyring), so
// keys run refuses fail here with run's words. Neither says a secret.
func checkSigningKeys(bf *brokerFlags, r *report) {
	ring, err := driver.Keyring(bf.SigningKeys)
	switch {
	case err != nil:
		r.fail("%v", err)
	case ring != nil:
		r.ok("--signing-keys: %d key(s), %q signs", len(ring), ring[0].ID)
	}
}
