package redacturl

import "testing"

func TestHide_HidesThePasswordEvenWhenTheURLDoesNotParse(t *testing.T) {
	for _, c := range []struct{ raw, want string }{
		{"amqp://u:S3CRET@127.0.0.1:5672/", "amqp://u:xxxxx@127.0.0.1:5672/"},
		{"amqp://u:S3CRET@127.0.0.1:5672/\ttab", "amqp://u:xxxxx@127.0.0.1:5672/\ttab"},
		{"amqp://u:S3\"CRET@host/", "amqp://u:xxxxx@host/"},
		{"amqp://u:S3\\CRET@host/", "amqp://u:xxxxx@host/"},
		{"amqps://u:S3/CR@ET@host:5671/vh", "amqps://u:xxxxx@host:5671/vh"},
		{"amqp://u:12/S3CRET@host/", "amqp://u:xxxxx@host/"},
		{"amqp://u@host/", "amqp://u@host/"},
		{"amqp://host:5672/", "amqp://host:5672/"},
		{"u:S3CRET@host", "(unparseable URL)"},
	} {
		if got := Hide(c.raw); got != c.want {
			t.Errorf("Hide(%q) = %q, want %q", c.raw, got, c.want)
		}
	}
}
