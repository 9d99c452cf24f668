package rocket

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
)

// codeMessageIllegal is the broker's response code MESSAGE_ILLEGAL. For a
// timer message it means the delay is beyond the broker's timerMaxDelaySec
// (HookUtils.handleScheduleMessage answers WHEEL_TIMER_MSG_ILLEGAL, which
// the send processor turns into code 13); otherwise the message is too
// large or its properties are malformed. Either way sending it again fails
// the same way.
const codeMessageIllegal = 13

// rocketmq-client-go reports a non-success send response only as text:
// "CODE: 13, DESC: timer message illegal, the delay time should not be
// bigger than the max delay 3600000ms; ...".
var (
	codeRe     = regexp.MustCompile(`CODE:\s*(-?\d+)`)
	maxDelayRe = regexp.MustCompile(`max delay (\d+)\s*ms`)
)

// responseCode extracts the broker's response code from a client error, or
// returns -1 when err carries none.
func responseCode(err error) int {
	m := codeRe.FindStringSubmatch(err.Error())
	if m == nil {
		return -1
	}
	n, err2 := strconv.Atoi(m[1])
	if err2 != nil {
		return -1
	}
	return n
}

// RejectedError is a message the broker refused for good (response code
// 13). It matches broker.ErrRejected. For a timer message the broker's
// answer means the delay was beyond its timerMaxDelaySec; the error then
// names both that limit and the MaxHop delaybridge was configured with,
// because the usual cause is a MaxHop above the broker's setting.
type RejectedError struct {
	// Code is the broker's response code.
	Code int
	// Delay is the delay the message asked for, zero for an undelayed one.
	Delay time.Duration
	// ConfiguredMaxHop is Limits.MaxHop of the publisher.
	ConfiguredMaxHop time.Duration
	// BrokerMaxDelay is the broker's timerMaxDelaySec as its answer stated
	// it, or zero when the answer did not say.
	BrokerMaxDelay time.Duration
	// Cause is the client's error.
	Cause error
}

// Error names the delay, both limits when the broker stated its own, and
// the client's error.
func (e *RejectedError) Error() string {
	if e.BrokerMaxDelay > 0 {
		return fmt.Sprintf("rocket: broker rejected a timer delay of %v (code %d): the broker's timerMaxDelaySec is %v, delaybridge's configured MaxHop is %v; set MaxHop to at most the broker's limit: %v",
			e.Delay, e.Code, e.BrokerMaxDelay, e.ConfiguredMaxHop, e.Cause)
	}
	return fmt.Sprintf("rocket: broker rejected the message (code %d, delay %v, configured MaxHop %v): %v", e.Code, e.Delay, e.ConfiguredMaxHop, e.Cause)
}

// Unwrap lets errors.Is match both broker.ErrRejected and the client error.
func (e *RejectedError) Unwrap() []error { return []error{broker.ErrRejected, e.Cause} }

// classify turns a send error into what Publish reports.
func classify(err error, delay, maxHop time.Duration) error {
	if err == nil {
		return nil
	}
	if responseCode(err) != codeMessageIllegal {
		return fmt.Errorf("rocket: send: %w", err)
	}
	re := &RejectedError{Code: codeMessageIllegal, Delay: delay, ConfiguredMaxHop: maxHop, Cause: err}
	if m := maxDelayRe.FindStringSubmatch(err.Error()); m != nil && strings.Contains(err.Error(), "timer") {
		if ms, e := strconv.ParseInt(m[1], 10, 64); e == nil {
			re.BrokerMaxDelay = time.Duration(ms) * time.Millisecond
		}
	}
	return re
}

// errProperty reports a message field that cannot travel as a RocketMQ
// property: the wire format separates names from values with \x01 and
// properties with \x02.
var errProperty = errors.New("header contains \\x01 or \\x02, which RocketMQ uses to separate properties")
