package main

import (
	"slices"
	"testing"

	"github.com/spf13/pflag"
)

func TestAMQPNodes_FlagReachesTheRabbitConfig(t *testing.T) {
	var bf brokerFlags
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	bf.register(fs)
	if err := fs.Parse([]string{"--amqp-url", "amqp://u:p@n1:5672/", "--amqp-nodes", "n2:5672,n3:5672"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := bf.rabbitConfig(&app{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"n2:5672", "n3:5672"}; !slices.Equal(cfg.Nodes, want) {
		t.Fatalf("Config.Nodes %q, want %q", cfg.Nodes, want)
	}
}
