package rocket

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"testing"
	"time"
)

// fakeRoutes is a name server answering GET_ROUTEINFO_BY_TOPIC with route
// (or TOPIC_NOT_EXIST when route is empty) and GET_BROKER_CLUSTER_INFO with
// cluster.
func fakeRoutes(t *testing.T, route, cluster string) string {
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
					resp, body := remotingHeader{Opaque: h.Opaque, Flag: 1}, ""
					switch {
					case h.Code == codeGetBrokerClusterInfo:
						body = cluster
					case h.Code == codeGetRouteInfoByTopic && h.ExtFields["topic"] == "t" && route != "":
						body = route
					case h.Code == codeGetRouteInfoByTopic:
						resp.Code, resp.Remark = codeTopicNotExist, "No topic route info in name server for the topic: "+h.ExtFields["topic"]
					default:
						resp.Code = 1
					}
					header, _ := json.Marshal(resp)
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

func TestRoutedOn_WantsTheTopicRoutedToThatBroker(t *testing.T) {
	const (
		a       = "127.0.0.1:10921"
		b       = "127.0.0.1:10931"
		cluster = `{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"` + a + `"}},"broker-b":{"brokerAddrs":{0:"` + b + `"}}}}`
		onlyA   = `{"brokerDatas":[{"brokerName":"broker-a","brokerAddrs":{0:"` + a + `"}},{"brokerName":"broker-b","brokerAddrs":{0:"` + b + `"}}],"queueDatas":[{"brokerName":"broker-a","readQueueNums":4,"writeQueueNums":4}]}`
		both    = `{"brokerDatas":[{"brokerName":"broker-a","brokerAddrs":{0:"` + a + `"}},{"brokerName":"broker-b","brokerAddrs":{0:"` + b + `"}}],"queueDatas":[{"brokerName":"broker-a"},{"brokerName":"broker-b"}]}`
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		name, route, broker string
		want                bool
	}{
		{"no route yet", "", b, false},
		{"routed to the other group only", onlyA, b, false},
		{"routed to it", onlyA, a, true},
		{"routed to both", both, b, true},
		// A name the name servers do not know it by: any route counts.
		{"an address the name servers do not list", onlyA, "localhost:10931", true},
	} {
		ns := fakeRoutes(t, c.route, cluster)
		got, err := routedOn(ctx, Config{NameServers: []string{ns}}, c.broker, "t")
		if err != nil || got != c.want {
			t.Errorf("%s: routedOn = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	// A name server that does not answer is an error, unless another does.
	dead := "127.0.0.1:1"
	if got, err := routedOn(ctx, Config{NameServers: []string{dead}}, a, "t"); got || err == nil {
		t.Errorf("no name server answering: %v, %v; want false and an error", got, err)
	}
	if got, err := routedOn(ctx, Config{NameServers: []string{dead, fakeRoutes(t, both, cluster)}}, a, "t"); !got || err != nil {
		t.Errorf("one of two name servers answering: %v, %v; want true", got, err)
	}
}
