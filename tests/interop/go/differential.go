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
	"hash/crc32"
	"math"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
	"github.com/apache/rocketmq-clients/golang/v5/credentials"
	v2 "github.com/apache/rocketmq-clients/golang/v5/protocol/v2"
	"google.golang.org/grpc/status"
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
	if time.Since(start) < 40*time.Second {
		seen["dlq_within_s"] = "40"
	} else {
		seen["dlq_within_s"] = "more"
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

// -- helpers ---------------------------------------------------------------------------------

func attempt(call func() error) string {
	if err := call(); err != nil {
		return outcome(err)
	}
	return "OK"
}

var (
	statusInText = regexp.MustCompile(`CODE: ([A-Z_]+)`)
	clientID     = regexp.MustCompile(`clientId=[^,\s]*,?\s*`)
)

// outcome is an error as what the client made of it: `ErrRpcStatus <code>` for a status
// the server answered, `grpc <code>` for a failed call, `error CODE` when the client folded
// a server's status into its own message, `error: <message>` for the client's own refusals.
func outcome(err error) string {
	if rpc, ok := rmq.AsErrRpcStatus(err); ok {
		return "ErrRpcStatus " + v2.Code(rpc.GetCode()).String()
	}
	if s, ok := status.FromError(err); ok {
		return "grpc " + s.Code().String()
	}
	text := err.Error()
	if m := statusInText.FindStringSubmatch(text); m != nil {
		return "error " + m[1]
	}
	return "error: " + clientID.ReplaceAllString(text, "")
}

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

func attempts(views []*rmq.MessageView) []int32 {
	out := []int32{}
	for _, view := range views {
		out = append(out, view.GetDeliveryAttempt())
	}
	return out
}

func sorted(views []*rmq.MessageView) []*rmq.MessageView {
	out := append([]*rmq.MessageView{}, views...)
	sort.SliceStable(out, func(i, j int) bool { return body(out[i]) < body(out[j]) })
	return out
}

func sortedKeys(set map[string]bool) []string {
	out := []string{}
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// body is a delivered body as text, or its length and CRC32 when longer than 64 bytes.
func body(view *rmq.MessageView) string {
	b := view.GetBody()
	if len(b) > 64 {
		return fmt.Sprintf("%d bytes crc %x", len(b), crc32.ChecksumIEEE(b))
	}
	return string(b)
}

// describe is what a delivered message says, without its ids and times.
func describe(view *rmq.MessageView) map[string]any {
	keys := map[string]bool{}
	for _, k := range view.GetKeys() {
		keys[k] = true
	}
	properties := map[string]string{}
	for k, v := range view.GetProperties() {
		properties[k] = v
	}
	var tag, group any
	if t := view.GetTag(); t != nil {
		tag = *t
	}
	if g := view.GetMessageGroup(); g != nil {
		group = *g
	}
	return map[string]any{
		"topic": view.GetTopic(), "body": body(view), "tag": tag, "keys": sortedKeys(keys),
		"properties": properties, "message_group": group,
		"delivery_attempt":       view.GetDeliveryAttempt(),
		"has_delivery_timestamp": view.GetDeliveryTimestamp() != nil,
	}
}

// bucket is a delay between two deliveries as the nearest step of the default retry ladder.
func bucket(delay time.Duration) string {
	steps := []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute}
	names := []string{"1s", "5s", "10s", "30s", "1m"}
	ms := math.Max(float64(delay.Milliseconds()), 1)
	best := 0
	for i := range steps {
		if math.Abs(math.Log(ms/float64(steps[i].Milliseconds()))) <
			math.Abs(math.Log(ms/float64(steps[best].Milliseconds()))) {
			best = i
		}
	}
	return names[best]
}
