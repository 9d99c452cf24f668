package rocket

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
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
		{"messageDelayLevel": "1s 213504d"}, // past the longest duration: would wrap to 25m26s
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

// A broker without the timer wheel delivers a timer message at once: timer
// mode is refused there whichever timer field the limits set.
func TestResolve_RefusesTimerModeWithoutTheTimerWheel(t *testing.T) {
	b := BrokerLimits{Levels: DefaultLevels()}
	for name, l := range map[string]broker.Limits{
		"max hop":   {MaxHop: time.Hour},
		"precision": {Precision: time.Second},
		"both":      TimerLimits(time.Hour, time.Second),
	} {
		if got, err := b.Resolve(l); !errors.Is(err, ErrLimitsExceedBroker) {
			t.Errorf("%s: Resolve = %+v, %v; want ErrLimitsExceedBroker", name, got, err)
		}
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

// fakeNameServer answers every request on a listener of its own with the
// cluster table body, as a name server answers GET_BROKER_CLUSTER_INFO.
func fakeNameServer(t *testing.T, body string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			var size uint32
			if binary.Read(conn, binary.BigEndian, &size) == nil && size < 1<<20 {
				req := make([]byte, size)
				if _, err := io.ReadFull(conn, req); err == nil {
					var h remotingHeader
					_ = json.Unmarshal(req[4:4+binary.BigEndian.Uint32(req[:4])], &h)
					header, _ := json.Marshal(remotingHeader{Code: 0, Opaque: h.Opaque, Flag: 1})
					frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(header)+len(body)))
					frame = binary.BigEndian.AppendUint32(frame, uint32(len(header)))
					_, _ = conn.Write(append(append(frame, header...), body...))
				}
			}
			_ = conn.Close()
		}
	}()
	return ln.Addr().String()
}

// A broker group whose master is down does not stop a publisher from
// starting: the others' limits are used and the silent one is named.
func TestReadBrokerLimits_ABrokerDownIsNamedNotFatal(t *testing.T) {
	up := testenv.RocketBrokerAddr()
	if conn, err := net.DialTimeout("tcp", up, 5*time.Second); err != nil {
		testenv.Unreachable(t, "RocketMQ broker", up, err)
	} else {
		_ = conn.Close()
	}
	ns := fakeNameServer(t, `{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"`+up+`"},"brokerName":"broker-a"},"broker-down":{"brokerAddrs":{0:"127.0.0.1:1"},"brokerName":"broker-down"}}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	live, err := ReadBrokerLimits(ctx, Config{NameServers: []string{ns}, SendTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if live.Brokers["broker-a"] != up || live.Unanswered["broker-down"] == nil || !live.TimerWheel || live.TimerMaxDelay <= 0 {
		t.Errorf("ReadBrokerLimits = %+v", live)
	}
	// With no broker answering it is an error naming them.
	ns = fakeNameServer(t, `{"brokerAddrTable":{"broker-down":{"brokerAddrs":{0:"127.0.0.1:1"}}}}`)
	if _, err := ReadBrokerLimits(ctx, Config{NameServers: []string{ns}, SendTimeout: 2 * time.Second}); err == nil || !strings.Contains(err.Error(), "broker-down") {
		t.Errorf("no broker answering: %v", err)
	}
}
