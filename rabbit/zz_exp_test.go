package rabbit

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func BenchmarkZZEntry(b *testing.B) {
	for _, v := range []string{"cc", "headersx", "plainq", "nocc"} {
		b.Run(v, func(b *testing.B) {
			bb := benchSetup(b)
			bb.topic("bench")
			pub, err := NewPublisher(context.Background(), bb.cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer pub.Close()
			_ = pub.Publish(context.Background(), benchMessages("bench", 1, 0)...)
			conn, _ := amqp.Dial(bb.cfg.URL)
			defer conn.Close()
			ch, _ := conn.Channel()
			pq := bb.cfg.Prefix + ".plain"
			ch.QueueDeclare(pq, true, false, false, false, quorum(nil))
			defer ch.QueueDelete(pq, false, false, false)
			_ = ch.Confirm(false)
			confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1001))
			msgs := benchMessages("bench", b.N, time.Minute)
			outs := make([]outMsg, len(msgs))
			for i, m := range msgs {
				outs[i] = pub.prepare(m, time.Minute)
				switch v {
				case "headersx":
					delete(outs[i].pub.Headers, "CC")
					outs[i].pub.Headers["dlbl-9"] = "1"
					outs[i].exchange = pub.topo.levelExchange(9)
					outs[i].key = "bench"
				case "plainq":
					outs[i].key = pq
				case "nocc":
					delete(outs[i].pub.Headers, "CC")
				}
			}
			b.ResetTimer()
			start := time.Now()
			inflight := 0
			for _, o := range outs {
				if inflight == 1000 {
					if c := <-confirms; !c.Ack {
						b.Fatal("nack")
					}
					inflight--
				}
				_ = ch.PublishWithContext(context.Background(), o.exchange, o.key, true, false, o.pub)
				inflight++
			}
			for ; inflight > 0; inflight-- {
				<-confirms
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
		})
	}
}
