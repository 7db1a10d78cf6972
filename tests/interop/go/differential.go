// The differential scenarios: what a server does with each kind of message and each kind of
// mistake, reported as observations free of ids and times (codes, counts, attempt numbers,
// delay buckets, property names and values, topic names), so that the reports of two servers
// compare key by key (tests/interop/differential.py). They are the Java program's
// (Differential.java), observed under the same keys; where the Go client answers otherwise
// than the Java one, its own answer is what is reported.
//
// Topic and group of scenario S are P-S; the caller creates them beforehand with the type
// each needs (FIFO for fifo, DELAY for delay, TRANSACTION for transaction, NORMAL otherwise),
// and the groups P-S (P-fifo orderly, P-retry with 2 retries) and P-retry-dlq (the dead
// letters' reader).

package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
)

var differentialNames = []string{
	"normal", "fifo", "delay", "transaction", "invisible", "retry", "tag-filter",
	"large-body", "bad-topic", "bad-signature",
}

const maxBody = 4 * 1024 * 1024

type differential struct {
	endpoint, name       string
	accessKey, secretKey string
	timeout              time.Duration
	answers              *answers
	start                time.Time

	mu     sync.Mutex
	errors []string
}

func newDifferential(endpoint, name, accessKey, secretKey string, timeout time.Duration,
	answers *answers) *differential {
	return &differential{
		endpoint: endpoint, name: name, accessKey: accessKey, secretKey: secretKey,
		timeout: timeout, answers: answers, errors: []string{},
	}
}

func (d *differential) run(scenario string) map[string]any {
	d.start = time.Now()
	seen := map[string]any{}
	scenarios := map[string]func(map[string]any) error{
		"normal": d.normal, "fifo": d.fifo, "delay": d.delay, "transaction": d.transaction,
		"invisible": d.invisible, "retry": d.retry, "tag-filter": d.tagFilter,
		"large-body": d.largeBody, "bad-topic": d.badTopic, "bad-signature": d.badSignature,
	}
	if err := scenarios[scenario](seen); err != nil {
		d.fail(outcome(err))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return map[string]any{
		"scenario": scenario, "endpoint": d.endpoint, "topic": d.name, "observed": seen,
		"errors": append([]string{}, d.errors...), "elapsed_ms": time.Since(d.start).Milliseconds(),
	}
}

func (d *differential) progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "interop go: %s: %s (at %.1f s)\n", d.name, fmt.Sprintf(format, args...),
		time.Since(d.start).Seconds())
}

func (d *differential) fail(what string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.errors = append(d.errors, what)
}

// -- the scenarios ---------------------------------------------------------------------------

// normal: tag, keys and properties round-trip; one delivery each; the ack's outcome.
func (d *differential) normal(seen map[string]any) error {
	consumer, err := d.simpleConsumer(d.name, d.name, "*")
	if err != nil {
		return err
	}
	defer consumer.GracefulStop()
	ids := map[string]string{}
	producer, err := d.producer(d.secretKey, nil)
	if err != nil {
		return err
	}
	for i := 0; i < 3; i++ {
		n := fmt.Sprint(i)
		msg := d.message(d.name, "normal-"+n)
		msg.SetTag("tag-" + n)
		msg.SetKeys("key-"+n, "key-"+n+"-b")
		msg.AddProperty("prop", "value-"+n)
		msg.AddProperty("unicode", "é-"+n)
		receipts, err := send(producer, msg)
		if err != nil {
			producer.GracefulStop()
			return err
		}
		ids["normal-"+n] = receipts[0].MessageID
	}
	producer.GracefulStop()
	got, err := d.receiveUntil(consumer, 3, 30*time.Second)
	if err != nil {
		return err
	}
	messages, acks := []any{}, []string{}
	sameID := 0
	for _, view := range sorted(got) {
		messages = append(messages, describe(view))
		if view.GetMessageId() == ids[body(view)] {
			sameID++
		}
		acks = append(acks, d.ack(consumer, view))
	}
	seen["messages"] = messages
	seen["message_id_as_sent"] = sameID
	seen["acks"] = acks
	return nil
}

// fifo: FIFO in two message groups to an orderly group's simple consumer, acked as received.
func (d *differential) fifo(seen map[string]any) error {
	consumer, err := d.simpleConsumer(d.name, d.name, "*")
	if err != nil {
		return err
	}
	defer consumer.GracefulStop()
	var sent []string
	producer, err := d.producer(d.secretKey, nil)
	if err != nil {
		return err
	}
	for i := 0; i < 6; i++ {
		group := fmt.Sprintf("mg-%d", i%2)
		msg := d.message(d.name, fmt.Sprintf("%s-%d", group, i))
		msg.SetMessageGroup(group)
		if _, err := send(producer, msg); err != nil {
			producer.GracefulStop()
			return err
		}
		sent = append(sent, fmt.Sprintf("%s-%d", group, i))
	}
	producer.GracefulStop()
	order := map[string][]string{}
	groups := map[string]bool{}
	deadline := time.Now().Add(d.timeout)
	received := 0
	for received < len(sent) && time.Now().Before(deadline) {
		views, err := d.receive(consumer)
		if err != nil {
			return err
		}
		for _, view := range views {
			group := "(none)"
			if g := view.GetMessageGroup(); g != nil {
				group = *g
			}
			groups[group] = true
			order[group] = append(order[group], body(view))
			d.mustAck(consumer, view)
			received++
		}
	}
	inOrder := true
	for group, got := range order {
		var want []string
		for _, s := range sent {
			if strings.HasPrefix(s, group+"-") {
				want = append(want, s)
			}
		}
		inOrder = inOrder && strings.Join(got, ",") == strings.Join(want, ",")
	}
	seen["received"] = received
	seen["message_groups"] = sortedKeys(groups)
	seen["in_order"] = inOrder
	return nil
}

// delay: a message delivered 3 s after its send: how late it came, its delivery timestamp.
func (d *differential) delay(seen map[string]any) error {
	consumer, err := d.simpleConsumer(d.name, d.name, "*")
	if err != nil {
		return err
	}
	defer consumer.GracefulStop()
	producer, err := d.producer(d.secretKey, nil)
	if err != nil {
		return err
	}
	at := time.UnixMilli(time.Now().Add(3 * time.Second).UnixMilli())
	msg := d.message(d.name, "delay-0")
	msg.SetDelayTimestamp(at)
	if _, err := send(producer, msg); err != nil {
		producer.GracefulStop()
		return err
	}
	far := d.message(d.name, "far")
	far.SetDelayTimestamp(time.Now().Add(24*time.Hour + time.Minute))
	seen["send_at_limit"] = attempt(func() error { _, err := send(producer, far); return err })
	producer.GracefulStop()
	got, err := d.receiveUntil(consumer, 1, 30*time.Second)
	if err != nil {
		return err
	}
	arrived := time.Now()
	seen["received"] = len(got)
	if len(got) > 0 {
		view := got[0]
		stamp := view.GetDeliveryTimestamp()
		seen["delivery_timestamp_as_sent"] = stamp != nil && stamp.UnixMilli() == at.UnixMilli()
		late := arrived.Sub(at)
		switch {
		case late < -300*time.Millisecond:
			seen["delivered"] = "early"
		case late < 3*time.Second:
			seen["delivered"] = "within 3 s"
		default:
			seen["delivered"] = "late"
		}
		seen["message"] = describe(view)
		d.mustAck(consumer, view)
	}
	return nil
}

// transaction: one committed and one rolled-back half message: only the committed one arrives.
func (d *differential) transaction(seen map[string]any) error {
	consumer, err := d.simpleConsumer(d.name, d.name, "*")
	if err != nil {
		return err
	}
	defer consumer.GracefulStop()
	checker := &rmq.TransactionChecker{
		Check: func(*rmq.MessageView) rmq.TransactionResolution { return rmq.ROLLBACK },
	}
	producer, err := d.producer(d.secretKey, checker)
	if err != nil {
		return err
	}
	defer producer.GracefulStop()
	commit := producer.BeginTransaction()
	if _, err := sendIn(producer, d.message(d.name, "commit"), commit); err != nil {
		return err
	}
	rollback := producer.BeginTransaction()
	if _, err := sendIn(producer, d.message(d.name, "rollback"), rollback); err != nil {
		return err
	}
	seen["commit"] = attempt(commit.Commit)
	seen["rollback"] = attempt(rollback.RollBack)
	seen["commit_again"] = attempt(commit.Commit)
	got, err := d.receiveUntil(consumer, 1, 20*time.Second)
	if err != nil {
		return err
	}
	// a second look for the rolled-back one, which must never come
	more, err := d.receive(consumer)
	if err != nil {
		return err
	}
	messages := []any{}
	for _, view := range sorted(append(got, more...)) {
		messages = append(messages, describe(view))
		d.mustAck(consumer, view)
	}
	seen["messages"] = messages
	return nil
}

// invisible: receive, make visible again in 1 s, receive the second delivery; ack old and new.
func (d *differential) invisible(seen map[string]any) error {
	consumer, err := d.simpleConsumer(d.name, d.name, "*")
	if err != nil {
		return err
	}
	defer consumer.GracefulStop()
	producer, err := d.producer(d.secretKey, nil)
	if err != nil {
		return err
	}
	_, err = send(producer, d.message(d.name, "invisible-0"))
	producer.GracefulStop()
	if err != nil {
		return err
	}
	first, err := d.receiveUntil(consumer, 1, 20*time.Second)
	if err != nil {
		return err
	}
	seen["first_attempts"] = attempts(first)
	if len(first) == 0 {
		return nil
	}
	view := first[0]
	seen["illegal_receive_invisible"] = attempt(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := consumer.Receive(ctx, 1, time.Second)
		return err
	})
	seen["change"] = attempt(func() error { return consumer.ChangeInvisibleDuration(view, time.Second) })
	changed := time.Now()
	second, err := d.receiveUntil(consumer, 1, 20*time.Second)
	if err != nil {
		return err
	}
	after := time.Since(changed)
	seen["second_attempts"] = attempts(second)
	switch {
	case after < 3*time.Second:
		seen["second_within_s"] = "3"
	case after < 6*time.Second:
		seen["second_within_s"] = "6"
	default:
		seen["second_within_s"] = "more"
	}
	seen["ack_first_handle"] = d.ack(consumer, view)
	if len(second) > 0 {
		seen["ack_second"] = d.ack(consumer, second[0])
		seen["ack_second_again"] = d.ack(consumer, second[0])
	}
	return nil
}

type delivery struct {
	attempt int32
	at      time.Time
}

// retry: a push consumer that fails every delivery of its group (2 retries, so 3 attempts):
// the attempt numbers, the delays between them, then the dead-letter copy as a reader of
// %DLQ%<group> (group P-retry-dlq) receives it.
func (d *differential) retry(seen map[string]any) error {
	var mu sync.Mutex
	var deliveries []delivery
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(deliveries) }
	start := time.Now()
	listener := &rmq.FuncMessageListener{Consume: func(view *rmq.MessageView) rmq.ConsumerResult {
		mu.Lock()
		deliveries = append(deliveries, delivery{view.GetDeliveryAttempt(), time.Now()})
		mu.Unlock()
		return rmq.FAILURE
	}}
	consumer, err := rmq.NewPushConsumer(d.config(d.name, d.secretKey),
		rmq.WithPushSubscriptionExpressions(map[string]*rmq.FilterExpression{d.name: rmq.SUB_ALL}),
		rmq.WithPushMessageListener(listener),
	)
	if err != nil {
		return err
	}
	if err := consumer.Start(); err != nil {
		return err
	}
	producer, err := d.producer(d.secretKey, nil)
	if err != nil {
		consumer.GracefulStop()
		return err
	}
	msg := d.message(d.name, "retry-0")
	msg.SetTag("retried")
	msg.SetKeys("retry-key")
	msg.AddProperty("prop", "kept")
	_, err = send(producer, msg)
	producer.GracefulStop()
	if err != nil {
		consumer.GracefulStop()
		return err
	}
	d.progress("sent")
	deadline := time.Now().Add(30 * time.Second)
	for count() < 3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	d.progress("%d deliveries", count())
	time.Sleep(3 * time.Second) // a fourth delivery would be a mistake
	// stopped beside the dead-letter read, and not waited for: the stop waits out the
	// consumer's parked long poll (the server's long-polling timeout, 20 s on Apache), which
	// tells nothing of the server; the program's exit ends it if it is still waiting
	go consumer.GracefulStop()
	mu.Lock()
	numbers, delays := []int32{}, []string{}
	for i, delivered := range deliveries {
		numbers = append(numbers, delivered.attempt)
		if i > 0 {
			delays = append(delays, bucket(delivered.at.Sub(deliveries[i-1].at)))
		}
	}
	mu.Unlock()
	seen["attempts"] = numbers
	seen["delays"] = delays

	dlq := "%DLQ%" + d.name
	deadline = time.Now().Add(30 * time.Second)
	var dead []*rmq.MessageView
	lastFailure := ""
	for len(dead) == 0 && time.Now().Before(deadline) {
		dead, err = d.readOnce(d.name+"-dlq", dlq)
		if err != nil {
			lastFailure = outcome(err)
			time.Sleep(time.Second)
		}
	}
	d.progress("%d dead letters read", len(dead))
	seen["dlq_messages"] = len(dead)
	if len(dead) == 0 {
		seen["dlq_reader"] = lastFailure
	} else {
		seen["dlq_message"] = describe(dead[0])
	}
	// from the last failed delivery, not the scenario's start: the dead letter follows the
	// last attempt at once (a further retry would wait 30 s), and client starts and the
	// ladder's own delays stretch with the machine's load
	last := start
	mu.Lock()
	if n := len(deliveries); n > 0 {
		last = deliveries[n-1].at
	}
	mu.Unlock()
	if time.Since(last) < 20*time.Second {
		seen["dlq_after_last_within_s"] = "20"
	} else {
		seen["dlq_after_last_within_s"] = "more"
	}
	return nil
}

// readOnce receives what one simple consumer of `topic` finds within 20 s, and acks it.
func (d *differential) readOnce(group, topic string) ([]*rmq.MessageView, error) {
	reader, err := d.simpleConsumer(group, topic, "*")
	if err != nil {
		return nil, err
	}
	defer reader.GracefulStop()
	got, err := d.receiveUntil(reader, 1, 20*time.Second)
	for _, view := range got {
		d.mustAck(reader, view)
	}
	return got, err
}

// tagFilter: tags C, A, B and C to a subscription "A || B".
func (d *differential) tagFilter(seen map[string]any) error {
	consumer, err := d.simpleConsumer(d.name, d.name, "A || B")
	if err != nil {
		return err
	}
	defer consumer.GracefulStop()
	producer, err := d.producer(d.secretKey, nil)
	if err != nil {
		return err
	}
	for _, tag := range []string{"C", "A", "B", "C"} {
		msg := d.message(d.name, "tagged-"+tag)
		msg.SetTag(tag)
		if _, err := send(producer, msg); err != nil {
			producer.GracefulStop()
			return err
		}
	}
	producer.GracefulStop()
	got, err := d.receiveUntil(consumer, 2, 20*time.Second)
	if err != nil {
		return err
	}
	more, err := d.receive(consumer)
	if err != nil {
		return err
	}
	tags := []string{}
	for _, view := range append(got, more...) {
		tag := "(none)"
		if t := view.GetTag(); t != nil {
			tag = *t
		}
		tags = append(tags, tag)
		d.mustAck(consumer, view)
	}
	sort.Strings(tags)
	seen["tags"] = tags
	return nil
}

// largeBody: a body of exactly 4 MiB, and one byte more.
func (d *differential) largeBody(seen map[string]any) error {
	consumer, err := d.simpleConsumer(d.name, d.name, "*")
	if err != nil {
		return err
	}
	defer consumer.GracefulStop()
	payload := make([]byte, maxBody)
	for i := range payload {
		payload[i] = byte(i*31 + (i >> 11))
	}
	producer, err := d.producer(d.secretKey, nil)
	if err != nil {
		return err
	}
	seen["send_4MiB"] = attempt(func() error {
		_, err := send(producer, &rmq.Message{Topic: d.name, Body: payload})
		return err
	})
	more := append(append([]byte{}, payload...), 0)
	seen["send_4MiB_plus_1"] = attempt(func() error {
		_, err := send(producer, &rmq.Message{Topic: d.name, Body: more})
		return err
	})
	producer.GracefulStop()
	got, err := d.receiveUntil(consumer, 1, 30*time.Second)
	if err != nil {
		return err
	}
	seen["received"] = len(got)
	if len(got) > 0 {
		seen["received_intact"] = string(got[0].GetBody()) == string(payload)
		d.mustAck(consumer, got[0])
	}
	return nil
}

// badTopic: a topic that does not exist: send, and a consumer subscribing to it.
func (d *differential) badTopic(seen map[string]any) error {
	missing := d.name + "-missing"
	producer, err := d.producer(d.secretKey, nil)
	if err != nil {
		return err
	}
	seen["send"] = attempt(func() error { _, err := send(producer, d.message(missing, "lost")); return err })
	producer.GracefulStop()
	seen["simple_consumer"] = attempt(func() error {
		consumer, err := d.simpleConsumer(d.name, missing, "*")
		if err == nil {
			consumer.GracefulStop()
		}
		return err
	})
	seen["send_wrong_type"] = attempt(func() error {
		producer, err := d.producer(d.secretKey, nil)
		if err != nil {
			return err
		}
		defer producer.GracefulStop()
		msg := d.message(d.name, "typed")
		msg.SetMessageGroup("mg")
		_, err = send(producer, msg)
		return err
	})
	return nil
}

// badSignature: a wrong secret, and no credentials at all.
func (d *differential) badSignature(seen map[string]any) error {
	signed := func(secret, body string) func() error {
		return func() error {
			producer, err := d.producer(secret, nil)
			if err != nil {
				return err
			}
			defer producer.GracefulStop()
			_, err = send(producer, d.message(d.name, body))
			return err
		}
	}
	seen["wrong_secret_send"] = attempt(signed(d.secretKey+"-wrong", "forged"))
	seen["no_credentials_send"] = attempt(signed("", "anonymous"))
	seen["right_secret_send"] = attempt(signed(d.secretKey, "signed"))
	return nil
}
