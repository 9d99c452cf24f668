package rocket

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync/atomic"
	"time"
)

// A minimal client of RocketMQ's remoting protocol, for the admin requests
// rocketmq-client-go does not expose: the name server's cluster table, a
// topic's route read afresh, and a broker's configuration. Frames are
//
//	length (4 bytes, big-endian, of what follows)
//	header length (4 bytes: serialisation type 0 = JSON in the top byte)
//	header (JSON)
//	body
//
// and with ACL credentials every request carries the access key and an
// HMAC-SHA1 of its header fields (sorted by name) and body, as the client
// library signs its own requests.

// Request codes of the admin requests.
const (
	codeGetBrokerConfig      = 26
	codeGetRouteInfoByTopic  = 105
	codeGetBrokerClusterInfo = 106
	// codeTopicNotExist answers a route request for a topic no broker has.
	codeTopicNotExist = 17
)

// maxFrame bounds a response frame; a broker's configuration is a few KiB.
const maxFrame = 16 << 20

var remotingOpaque atomic.Int32

type remotingHeader struct {
	Code      int               `json:"code"`
	Language  string            `json:"language"`
	Version   int               `json:"version"`
	Opaque    int32             `json:"opaque"`
	Flag      int               `json:"flag"`
	Remark    string            `json:"remark,omitempty"`
	ExtFields map[string]string `json:"extFields,omitempty"`
}

// remotingCall sends one request with code and the header fields ext to
// addr and returns the body of a successful response.
func remotingCall(ctx context.Context, c Config, addr string, code int, ext map[string]string) ([]byte, error) {
	d := net.Dialer{Timeout: c.SendTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if c.TLS {
		// The client library does not verify RocketMQ's certificates
		// either (Config.TLS says so); this matches it.
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true})
		defer tc.Close()
		conn = tc
	}
	deadline := time.Now().Add(c.SendTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = conn.SetDeadline(deadline)
	// Version is the client's protocol version; brokers answer these two
	// requests the same for any value, and 317 is what the Go client sends.
	h := remotingHeader{Code: code, Language: "GO", Version: 317, Opaque: remotingOpaque.Add(1), ExtFields: ext}
	if c.AccessKey != "" {
		h.ExtFields = signed(ext, nil, c.AccessKey, c.SecretKey)
	}
	header, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	frame := make([]byte, 8, 8+len(header))
	binary.BigEndian.PutUint32(frame[0:4], uint32(4+len(header)))
	binary.BigEndian.PutUint32(frame[4:8], uint32(len(header)))
	if _, err := conn.Write(append(frame, header...)); err != nil {
		return nil, err
	}
	var size uint32
	if err := binary.Read(conn, binary.BigEndian, &size); err != nil {
		return nil, err
	}
	if size < 4 || size > maxFrame {
		return nil, fmt.Errorf("response frame of %d bytes", size)
	}
	raw := make([]byte, size)
	if _, err := io.ReadFull(conn, raw); err != nil {
		return nil, err
	}
	hl := binary.BigEndian.Uint32(raw[:4])
	if hl>>24 != 0 || int(hl&0xFFFFFF) > len(raw)-4 {
		return nil, errors.New("response is not a JSON remoting frame")
	}
	var resp remotingHeader
	if err := json.Unmarshal(raw[4:4+hl], &resp); err != nil {
		return nil, fmt.Errorf("response header: %w", err)
	}
	if resp.Code != 0 {
		return nil, &refusedError{Request: code, Code: resp.Code, Remark: resp.Remark}
	}
	return raw[4+hl:], nil
}

// refusedError is a response with a code other than success.
type refusedError struct {
	Request, Code int
	Remark        string
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("request code %d refused with code %d: %s", e.Request, e.Code, e.Remark)
}

// signed returns ext with the ACL fields added: AccessKey and the
// Signature over every field's value in the order of the names, then body.
func signed(ext map[string]string, body []byte, accessKey, secretKey string) map[string]string {
	out := map[string]string{"AccessKey": accessKey}
	for k, v := range ext {
		out[k] = v
	}
	names := make([]string, 0, len(out))
	for k := range out {
		names = append(names, k)
	}
	sort.Strings(names)
	mac := hmac.New(sha1.New, []byte(secretKey))
	for _, k := range names {
		mac.Write([]byte(out[k]))
	}
	mac.Write(body)
	out["Signature"] = base64.StdEncoding.EncodeToString(mac.Sum(nil))
	return out
}

// brokerMasters asks a name server for the master address of every broker
// group it knows.
func brokerMasters(ctx context.Context, c Config, nameServer string) (map[string]string, error) {
	body, err := remotingCall(ctx, c, nameServer, codeGetBrokerClusterInfo, nil)
	if err != nil {
		return nil, err
	}
	var info struct {
		BrokerAddrTable map[string]struct {
			BrokerAddrs map[string]string `json:"brokerAddrs"`
		} `json:"brokerAddrTable"`
	}
	if err := json.Unmarshal(quoteNumericKeys(body), &info); err != nil {
		return nil, fmt.Errorf("cluster info from %s: %w", nameServer, err)
	}
	out := map[string]string{}
	for name, b := range info.BrokerAddrTable {
		if addr := b.BrokerAddrs["0"]; addr != "" {
			out[name] = addr
		}
	}
	return out, nil
}

// routedMasters asks a name server for topic's route and returns the
// master addresses of the broker groups that have queues of it; none when
// no broker has the topic.
func routedMasters(ctx context.Context, c Config, nameServer, topic string) (map[string]bool, error) {
	body, err := remotingCall(ctx, c, nameServer, codeGetRouteInfoByTopic, map[string]string{"topic": topic})
	var refused *refusedError
	if errors.As(err, &refused) && refused.Code == codeTopicNotExist {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	var route struct {
		BrokerDatas []struct {
			BrokerName  string            `json:"brokerName"`
			BrokerAddrs map[string]string `json:"brokerAddrs"`
		} `json:"brokerDatas"`
		QueueDatas []struct {
			BrokerName string `json:"brokerName"`
		} `json:"queueDatas"`
	}
	if err := json.Unmarshal(quoteNumericKeys(body), &route); err != nil {
		return nil, fmt.Errorf("route of %s from %s: %w", topic, nameServer, err)
	}
	queued := map[string]bool{}
	for _, q := range route.QueueDatas {
		queued[q.BrokerName] = true
	}
	out := map[string]bool{}
	for _, b := range route.BrokerDatas {
		if addr := b.BrokerAddrs["0"]; addr != "" && queued[b.BrokerName] {
			out[addr] = true
		}
	}
	return out, nil
}

// quoteNumericKeys turns the name server's {0:"addr"} (fastjson writes
// integer map keys unquoted) into {"0":"addr"}, outside string literals.
func quoteNumericKeys(b []byte) []byte {
	var out strings.Builder
	inString, escaped := false, false
	for i := 0; i < len(b); i++ {
		ch := b[i]
		if inString {
			out.WriteByte(ch)
			switch {
			case escaped:
				escaped = false
			case ch == '\\':
				escaped = true
			case ch == '"':
				inString = false
			}
			continue
		}
		if ch == '"' {
			inString = true
			out.WriteByte(ch)
			continue
		}
		if (ch == '{' || ch == ',') && i+1 < len(b) {
			j := i + 1
			for j < len(b) && (b[j] == '-' || b[j] >= '0' && b[j] <= '9') {
				j++
			}
			if j > i+1 && j < len(b) && b[j] == ':' {
				out.WriteByte(ch)
				out.WriteByte('"')
				out.Write(b[i+1 : j])
				out.WriteByte('"')
				i = j - 1
				continue
			}
		}
		out.WriteByte(ch)
	}
	return []byte(out.String())
}

// brokerConfig asks a broker for its configuration, the lines of a Java
// properties file.
func brokerConfig(ctx context.Context, c Config, addr string) (map[string]string, error) {
	body, err := remotingCall(ctx, c, addr, codeGetBrokerConfig, nil)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(body), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out, nil
}
