package rocket

import (
	"fmt"
	"strings"
	"time"
)

// parseLevelsSetting reads --rocketmq-levels as ParseLevels reads the
// broker's list: ascending positive levels such as
// "1s 5s 1m 2h 1d". Commas may separate the levels too. Errors name
// --rocketmq-levels.
func parseLevelsSetting(s string) ([]time.Duration, error) {
	levels, err := ParseLevels(strings.ReplaceAll(s, ",", " "))
	if err != nil {
		return nil, fmt.Errorf("--rocketmq-levels: %w", err)
	}
	return levels, nil
}
