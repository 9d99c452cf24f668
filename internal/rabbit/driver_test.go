package rabbit

import (
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/internal/driver"
)

// flagSettings reads args as the daemon's flags into the defaults.
func flagSettings(t *testing.T, args ...string) *driver.Settings {
	t.Helper()
	s, err := driver.ParseArgs(append([]string{}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestFromSettings_DeadLetteringFlag(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want DeadLettering
		err  string
	}{
		{nil, AtLeastOnce, ""},
		{[]string{"--rabbit-dead-lettering", "at-most-once"}, AtMostOnce, ""},
		{[]string{"--rabbit-dead-lettering", "at-least-once"}, AtLeastOnce, ""},
		{[]string{"--rabbit-dead-lettering", "exactly-once"}, 0, "--rabbit-dead-lettering"},
	} {
		rc, err := fromSettings(flagSettings(t, append([]string{"--amqp-url", "amqp://u:p@127.0.0.1:5672/"}, c.args...)...), nil)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "at-most-once") {
				t.Errorf("%v: err = %v, want one naming %s and the choices", c.args, err, c.err)
			}
			continue
		}
		if err != nil || rc.DeadLettering != c.want {
			t.Errorf("%v: DeadLettering = %v, %v; want %v", c.args, rc.DeadLettering, err, c.want)
		}
	}
}

// The flat settings' defaults are the adapter's, and the adapter built
// from them is the one the settings name.
func TestFromSettings_DefaultsAreTheAdapters(t *testing.T) {
	t.Parallel()
	s := flagSettings(t, "--amqp-url", "amqp://x")
	rc, err := fromSettings(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Prefix != DefaultPrefix || rc.Unit != DefaultUnit || rc.Depth != DefaultDepth || rc.Prefetch != DefaultPrefetch || rc.MaxLength != DefaultMaxLength || rc.Mode != ModeLadder {
		t.Errorf("defaults = %+v", rc)
	}
	a, err := s.Adapter(nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Name() != "rabbit" || a.Mode() != "ladder" {
		t.Errorf("adapter %s (%s), want rabbit (ladder)", a.Name(), a.Mode())
	}
	s.RabbitMode = "delayed-exchange"
	if a, err := s.Adapter(nil); err != nil || a.Mode() != "delayed-exchange" {
		t.Errorf("delayed-exchange settings: %v, %v", a, err)
	}
}
