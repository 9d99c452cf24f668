package driver

import (
	"strings"
	"testing"
)

// This test binary links no adapter: a --broker of this module's names
// the import that links it, and any other name lists the choices.
func TestAdapter_NotLinkedNamesTheImport(t *testing.T) {
	for name, want := range map[string]string{
		"rabbit": "import github.com/delaybridge/delaybridge/rabbit",
		"rocket": "import github.com/delaybridge/delaybridge/rocket",
		"kafka":  `--broker "kafka": want rabbit or rocket`,
	} {
		s := Defaults()
		s.Broker = name
		if _, err := s.Adapter(nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--broker %s: %v, want %q", name, err, want)
		}
	}
	if s := Defaults(); s.Broker != "rabbit" || s.RabbitPrefix != "" {
		t.Errorf("defaults without adapters = %+v, want rabbit and nothing of an adapter", s)
	}
}
