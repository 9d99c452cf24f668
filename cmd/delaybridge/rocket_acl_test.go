package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/driver"
	"github.com/delaybridge/delaybridge/internal/rocket"
)

// firstRequest accepts one connection on ln and returns the first RocketMQ
// remoting frame the client sends: the raw bytes and the header's
// extFields. It answers nothing; the client's call times out.
func firstRequest(t *testing.T, ln net.Listener) (raw []byte, ext map[string]string) {
	t.Helper()
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatalf("no client connected: %v", err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var size uint32
	if err := binary.Read(conn, binary.BigEndian, &size); err != nil || size < 4 || size > 1<<20 {
		t.Fatalf("frame length %d: %v", size, err)
	}
	raw = make([]byte, size)
	if _, err := io.ReadFull(conn, raw); err != nil {
		t.Fatal(err)
	}
	// Serialization type in the top byte (0 = JSON), header length below.
	headerLen := binary.BigEndian.Uint32(raw[:4]) & 0xFFFFFF
	if raw[0] != 0 || int(headerLen) > len(raw)-4 {
		t.Fatalf("not a JSON remoting header: % x", raw[:4])
	}
	var header struct {
		ExtFields map[string]string `json:"extFields"`
	}
	if err := json.Unmarshal(raw[4:4+headerLen], &header); err != nil {
		t.Fatalf("header: %v\n%s", err, raw[4:4+headerLen])
	}
	return raw, header.ExtFields
}

// TestRocketACL_CredentialsSignProducerAndConsumerRequests checks, on the wire,
// that the access key and secret key given on the command line reach the
// producer and the consumer: each request carries the
// access key and an HMAC signature, and the secret key itself never leaves
// the process. The shared test broker runs without ACL (turning it on would
// break every other test), so the first request is read by a listener of
// the test's own instead.
func TestRocketACL_CredentialsSignProducerAndConsumerRequests(t *testing.T) {
	const accessKey, secretKey = "ak-delaybridge-test", "sk-Never-On-The-Wire-42"
	for _, c := range []struct {
		name string
		call func(ctx context.Context, cfg rocket.Config) error
	}{
		{"producer", func(ctx context.Context, cfg rocket.Config) error {
			pub, err := rocket.NewPublisher(ctx, cfg)
			if err != nil {
				return err
			}
			defer pub.Close()
			return pub.Publish(ctx, &broker.Message{Topic: "acl-probe", Key: "k", DeliverAt: broker.MillisUTC(time.Now().Add(time.Second))})
		}},
		{"consumer", func(ctx context.Context, cfg rocket.Config) error {
			sub, err := rocket.NewSubscriber(cfg)
			if err != nil {
				return err
			}
			defer sub.Close()
			_, err = sub.Subscribe(ctx, "acl-probe")
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			a := settingsAfter(t, nil)
			bf := brokerFlags{Settings: driver.Settings{RocketNameServers: ln.Addr().String(), RocketMode: "timer", RocketMaxDelay: time.Hour, RocketPrecision: 100 * time.Millisecond,
				RocketGroupPrefix: "acl", RocketAccessKey: accessKey, RocketSecretKey: secretKey}}
			cfg, err := bf.rocketConfig(&a)
			if err != nil {
				t.Fatal(err)
			}
			cfg.SendTimeout, cfg.AssignWait = time.Second, time.Second
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// The call fails against the silent listener; only what it sent
			// matters, so nothing waits for it.
			go func() { _ = c.call(ctx, cfg) }()
			raw, ext := firstRequest(t, ln)
			if ext["AccessKey"] != accessKey || ext["Signature"] == "" {
				t.Errorf("request ext fields %v: want AccessKey %q and a Signature", ext, accessKey)
			}
			if bytes.Contains(raw, []byte(secretKey)) {
				t.Errorf("the secret key travels in the request:\n%q", raw)
			}
		})
	}
	// The admin client would send CreateTopic unsigned: refused up front.
	a := settingsAfter(t, nil)
	bf := brokerFlags{Settings: driver.Settings{RocketNameServers: "127.0.0.1:1", RocketMode: "timer", RocketMaxDelay: time.Hour, RocketPrecision: 100 * time.Millisecond, RocketAccessKey: accessKey, RocketSecretKey: secretKey}}
	cfg, err := bf.rocketConfig(&a)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := rocket.NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.CreateTopic(context.Background(), "127.0.0.1:1", "acl-probe", 1); !errors.Is(err, rocket.ErrCreateTopicWithACL) {
		t.Errorf("CreateTopic with credentials: %v, want ErrCreateTopicWithACL", err)
	}
	pub.Close()
	// Without credentials no request is signed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		pub, err := rocket.NewPublisher(ctx, rocket.Config{NameServers: []string{ln.Addr().String()}, SendTimeout: time.Second})
		if err != nil {
			return
		}
		defer pub.Close()
		_ = pub.Publish(ctx, &broker.Message{Topic: "acl-probe", Key: "k", DeliverAt: broker.MillisUTC(time.Now())})
	}()
	if _, ext := firstRequest(t, ln); ext["AccessKey"] != "" || ext["Signature"] != "" {
		t.Errorf("an unsigned client sent %v", ext)
	}
}
