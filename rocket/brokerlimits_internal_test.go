package rocket

import (
	"encoding/json"
	"errors"
	"testing"
	"time"
)

func TestQuoteNumericKeys_MakesTheNameServersJSONReadable(t *testing.T) {
	in := `{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"},"brokerName":"broker-a","cluster":"DefaultCluster"},"b{1:x}":{"brokerAddrs":{0:"10.0.0.2:10911"}}},"clusterAddrTable":{"DefaultCluster":["broker-a"]}}`
	var info struct {
		BrokerAddrTable map[string]struct {
			BrokerAddrs map[string]string `json:"brokerAddrs"`
		} `json:"brokerAddrTable"`
	}
	if err := json.Unmarshal(quoteNumericKeys([]byte(in)), &info); err != nil {
		t.Fatal(err)
	}
	if a := info.BrokerAddrTable["broker-a"].BrokerAddrs; a["0"] != "127.0.0.1:10911" || a["1"] != "127.0.0.1:10921" {
		t.Errorf("broker-a addresses %v", a)
	}
	if a := info.BrokerAddrTable["b{1:x}"].BrokerAddrs; a["0"] != "10.0.0.2:10911" {
		t.Errorf("a name holding {1: was changed: %v", info.BrokerAddrTable)
	}
}

func TestParseBrokerLimits_FromBrokerConfigurations(t *testing.T) {
	b, err := parseBrokerLimits(map[string]string{"timerWheelEnable": "true", "timerMaxDelaySec": "259200", "timerPrecisionMs": "1000", "messageDelayLevel": "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"})
	if err != nil || !b.TimerWheel || b.TimerMaxDelay != DefaultTimerMaxDelay || b.TimerPrecision != time.Second || len(b.Levels) != 18 {
		t.Errorf("5.x defaults: %+v, %v", b, err)
	}
	// A 4.x broker has no timer settings at all.
	b, err = parseBrokerLimits(map[string]string{"messageDelayLevel": "1s 1m 1h 1d"})
	if err != nil || b.TimerWheel || b.Limits().Levels[3] != 24*time.Hour {
		t.Errorf("4.x: %+v, %v", b, err)
	}
	for _, bad := range []map[string]string{
		{"timerWheelEnable": "true", "timerMaxDelaySec": "x", "timerPrecisionMs": "1000", "messageDelayLevel": "1s"},
		{"timerWheelEnable": "true", "timerMaxDelaySec": "60", "timerPrecisionMs": "0", "messageDelayLevel": "1s"},
		{"messageDelayLevel": "5s 1s"},
		{"messageDelayLevel": "1x"},
		{},
	} {
		if b, err := parseBrokerLimits(bad); err == nil {
			t.Errorf("parseBrokerLimits(%v) = %+v, want an error", bad, b)
		}
	}
}

func TestResolve_TimerWheelOffRefusesTimerModeAndOffersLevels(t *testing.T) {
	b := BrokerLimits{Levels: DefaultLevels()}
	if l, err := b.Resolve(TimerLimits(time.Hour, time.Second)); !errors.Is(err, ErrLimitsExceedBroker) {
		t.Errorf("Resolve = %+v, %v; want ErrLimitsExceedBroker", l, err)
	}
	if l, err := b.Resolve(TimerLimits(0, 0)); err != nil || len(l.Levels) != 18 {
		t.Errorf("nothing set on a broker without timers: %+v, %v; want its levels", l, err)
	}
}

func TestSigned_SignsSortedValuesThenBody(t *testing.T) {
	a := signed(map[string]string{"b": "2", "a": "1"}, []byte("body"), "ak", "sk")
	b := signed(map[string]string{"a": "1", "b": "2"}, []byte("body"), "ak", "sk")
	if a["AccessKey"] != "ak" || a["Signature"] == "" || a["Signature"] != b["Signature"] {
		t.Errorf("signed = %v and %v", a, b)
	}
	if c := signed(map[string]string{"a": "1", "b": "2"}, []byte("other"), "ak", "sk"); c["Signature"] == a["Signature"] {
		t.Error("the body does not change the signature")
	}
}
