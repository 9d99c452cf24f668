package settings

import (
	"fmt"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/rocket"
)

// ParseLevels parses a RocketMQ messageDelayLevel list as the broker
// reads it (see rocket.ParseLevels): ascending positive levels such as
// "1s 5s 1m 2h 1d". Commas may separate the levels too. Errors name
// --rocketmq-levels.
func ParseLevels(s string) ([]time.Duration, error) {
	levels, err := rocket.ParseLevels(strings.ReplaceAll(s, ",", " "))
	if err != nil {
		return nil, fmt.Errorf("--rocketmq-levels: %w", err)
	}
	return levels, nil
}
