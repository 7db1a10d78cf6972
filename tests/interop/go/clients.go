// The differential scenarios' clients, made and called the same way in every scenario.

package main

import (
	"context"
	"strings"
	"time"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
	"github.com/apache/rocketmq-clients/golang/v5/credentials"
	v2 "github.com/apache/rocketmq-clients/golang/v5/protocol/v2"
)

// mustAck acknowledges a delivery whose ack is not itself observed: a failed one is an error.
func (d *differential) mustAck(consumer rmq.SimpleConsumer, view *rmq.MessageView) {
	if outcome := d.ack(consumer, view); outcome != "OK" {
		d.fail("ack: " + outcome)
	}
}

// ack acknowledges a delivery and reports it: the client's outcome, and the server's own
// answer where the client dropped it (answers.go).
func (d *differential) ack(consumer rmq.SimpleConsumer, view *rmq.MessageView) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := consumer.Ack(ctx, view); err != nil {
		return outcome(err)
	}
	if code := d.answers.ack(view.GetReceiptHandle()); code != v2.Code_OK {
		return "OK (server: " + code.String() + ")"
	}
	return "OK"
}

func (d *differential) config(group, secret string) *rmq.Config {
	config := &rmq.Config{Endpoint: d.endpoint, ConsumerGroup: group}
	if d.accessKey != "" && secret != "" {
		config.Credentials = &credentials.SessionCredentials{AccessKey: d.accessKey, AccessSecret: secret}
	}
	return config
}

type timed interface{ SetRequestTimeout(time.Duration) }

// producer is started; its calls wait 5 s for an answer, and it sends each message once.
// It names the scenario's topic at its start: a Go producer given no topic never learns an
// endpoint to sync its settings with, and its Start waits for that sync forever.
func (d *differential) producer(secret string, checker *rmq.TransactionChecker) (rmq.Producer, error) {
	opts := []rmq.ProducerOption{rmq.WithMaxAttempts(1), rmq.WithTopics(d.name)}
	if checker != nil {
		opts = append(opts, rmq.WithTransactionChecker(checker))
	}
	producer, err := rmq.NewProducer(d.config("", secret), opts...)
	if err != nil {
		return nil, err
	}
	if t, ok := producer.(timed); ok {
		t.SetRequestTimeout(5 * time.Second)
	}
	if err := producer.Start(); err != nil {
		return nil, err
	}
	return producer, nil
}

func (d *differential) simpleConsumer(group, topic, tags string) (rmq.SimpleConsumer, error) {
	consumer, err := rmq.NewSimpleConsumer(d.config(group, d.secretKey),
		rmq.WithSimpleAwaitDuration(5*time.Second),
		rmq.WithSimpleSubscriptionExpressions(map[string]*rmq.FilterExpression{
			topic: rmq.NewFilterExpressionWithType(tags, rmq.TAG),
		}),
	)
	if err != nil {
		return nil, err
	}
	if t, ok := consumer.(timed); ok {
		t.SetRequestTimeout(5 * time.Second)
	}
	if err := consumer.Start(); err != nil {
		return nil, err
	}
	return consumer, nil
}

func (d *differential) message(topic, body string) *rmq.Message {
	return &rmq.Message{Topic: topic, Body: []byte(body)}
}

func send(producer rmq.Producer, msg *rmq.Message) ([]*rmq.SendReceipt, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return producer.Send(ctx, msg)
}

func sendIn(producer rmq.Producer, msg *rmq.Message, tx rmq.Transaction) ([]*rmq.SendReceipt, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return producer.SendWithTransaction(ctx, msg, tx)
}

func (d *differential) receiveUntil(consumer rmq.SimpleConsumer, count int, within time.Duration) ([]*rmq.MessageView, error) {
	var got []*rmq.MessageView
	deadline := time.Now().Add(within)
	for len(got) < count && time.Now().Before(deadline) {
		views, err := d.receive(consumer)
		if err != nil {
			return got, err
		}
		got = append(got, views...)
	}
	return got, nil
}

// receive is one long poll, bounded: a server whose answer never ends is a receive that timed
// out. An empty poll, which the client reports as MESSAGE_NOT_FOUND, is no message.
func (d *differential) receive(consumer rmq.SimpleConsumer) ([]*rmq.MessageView, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	views, err := consumer.Receive(ctx, 16, 20*time.Second)
	if rpc, ok := rmq.AsErrRpcStatus(err); ok && rpc.GetCode() == int32(v2.Code_MESSAGE_NOT_FOUND) {
		return nil, nil
	}
	if err != nil && (ctx.Err() != nil || strings.Contains(err.Error(), "CODE=DEADLINE_EXCEEDED")) {
		// the client gives up after its await duration and request timeout, 10 s
		d.fail("receive: no answer within 10 s")
		return nil, nil
	}
	if err != nil {
		d.progress("receive: %v", err)
	}
	return views, err
}
