// The digest scenarios (push, simple, fifo-push): the same 20 bodies to each consumer type,
// and whether each arrives, uncorrupted and in order (tests/interop/README.md).

package main

import (
	"context"
	"fmt"
	"hash/crc32"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
	"github.com/apache/rocketmq-clients/golang/v5/credentials"
)

const (
	perLevel      = 3
	levels        = 4
	plainBodies   = 8
	messageGroups = 3
)

var digestNames = []string{"push", "simple", "fifo-push"}

// bodies are the message bodies every scenario sends: for z = 1..4, the first three
// "crafted-<n>" (n = 0, 1, ...; none taken twice) whose CRC32 is below 16^(8-z), i.e. whose
// 8-digit hex has at least z leading zeros; then "plain-<i>" repeated i*512 times, i = 1..8.
func bodies() [][]byte {
	var out [][]byte
	taken := map[int]bool{}
	for z := 1; z <= levels; z++ {
		limit := uint64(1) << (32 - 4*z)
		found := 0
		for n := 0; found < perLevel; n++ {
			b := []byte("crafted-" + strconv.Itoa(n))
			if !taken[n] && uint64(crc32.ChecksumIEEE(b)) < limit {
				taken[n] = true
				out = append(out, b)
				found++
			}
		}
	}
	for i := 1; i <= plainBodies; i++ {
		out = append(out, []byte(strings.Repeat("plain-"+strconv.Itoa(i), i*512)))
	}
	return out
}

func crcHex(b []byte) string { return fmt.Sprintf("%08X", crc32.ChecksumIEEE(b)) }

func label(body string) string {
	head := body
	if len(head) > 16 {
		head = head[:16] + "..."
	}
	return head + " crc=" + crcHex([]byte(body))
}

// corrupted reads the client's own verdict on a received message (kept in an unexported
// field: the client exposes it to its consumers only).
func corrupted(mv *rmq.MessageView) bool {
	f := reflect.ValueOf(mv).Elem().FieldByName("corrupted")
	return f.IsValid() && f.Bool()
}

type run struct {
	endpoint, name string
	timeout        time.Duration
	bodies         [][]byte

	mu         sync.Mutex
	expected   map[string]bool
	sent       map[string]bool
	sentOrder  []string
	groupOf    map[string]string
	received   map[string]bool
	unexpected map[string]bool
	order      map[string][]string
	calls      int
	errors     []string
}

func newRun(endpoint, name string, timeout time.Duration) *run {
	r := &run{
		endpoint: endpoint, name: name, timeout: timeout, bodies: bodies(),
		expected: map[string]bool{}, sent: map[string]bool{}, groupOf: map[string]string{},
		received: map[string]bool{}, unexpected: map[string]bool{}, order: map[string][]string{},
	}
	for _, b := range r.bodies {
		r.expected[string(b)] = true
	}
	return r
}

func (r *run) progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "interop go: %s: %s\n", r.name, fmt.Sprintf(format, args...))
}

func (r *run) fail(what string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, what+": "+err.Error())
}

func (r *run) config() *rmq.Config {
	return &rmq.Config{
		Endpoint:      r.endpoint,
		ConsumerGroup: r.name,
		Credentials:   &credentials.SessionCredentials{},
	}
}

func (r *run) subscription() map[string]*rmq.FilterExpression {
	return map[string]*rmq.FilterExpression{r.name: rmq.SUB_ALL}
}

func (r *run) record(mv *rmq.MessageView) string {
	body := string(mv.GetBody())
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.expected[body] {
		r.received[body] = true
	} else {
		r.unexpected[label(body)] = true
	}
	return body
}

func (r *run) allReceived() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for b := range r.sent {
		if !r.received[b] {
			return false
		}
	}
	return true
}

func (r *run) waitForAll() {
	start := time.Now()
	for !r.allReceived() && time.Since(start) < r.timeout {
		time.Sleep(50 * time.Millisecond)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.progress("received %d of %d in %d ms", len(r.received), len(r.sent), time.Since(start).Milliseconds())
}

// send sends every body (FIFO ones round-robin over the message groups).
func (r *run) send(fifo bool) error {
	producer, err := rmq.NewProducer(r.config(), rmq.WithTopics(r.name))
	if err != nil {
		return err
	}
	if err := producer.Start(); err != nil {
		return err
	}
	defer producer.GracefulStop()
	for i, b := range r.bodies {
		msg := &rmq.Message{Topic: r.name, Body: b}
		msg.SetTag("digest")
		group := ""
		if fifo {
			group = "mg-" + strconv.Itoa(i%messageGroups)
			msg.SetMessageGroup(group)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := producer.Send(ctx, msg)
		cancel()
		if err != nil {
			r.fail("send", err)
			continue
		}
		r.mu.Lock()
		r.sent[string(b)] = true
		r.sentOrder = append(r.sentOrder, string(b))
		r.groupOf[string(b)] = group
		r.mu.Unlock()
	}
	r.progress("sent %d messages", len(r.sent))
	return nil
}

func (r *run) push(out map[string]any, fifo bool) error {
	listener := &rmq.FuncMessageListener{Consume: func(mv *rmq.MessageView) rmq.ConsumerResult {
		body := r.record(mv)
		r.mu.Lock()
		r.calls++
		if g := mv.GetMessageGroup(); g != nil {
			r.order[*g] = append(r.order[*g], body)
		}
		r.mu.Unlock()
		return rmq.SUCCESS
	}}
	consumer, err := rmq.NewPushConsumer(r.config(),
		rmq.WithPushSubscriptionExpressions(r.subscription()),
		rmq.WithPushMessageListener(listener),
		rmq.WithPushConsumptionThreadCount(4),
	)
	if err != nil {
		return err
	}
	if err := consumer.Start(); err != nil {
		return err
	}
	defer consumer.GracefulStop()
	r.progress("push consumer started")
	if err := r.send(fifo); err != nil {
		return err
	}
	r.waitForAll()
	r.mu.Lock()
	defer r.mu.Unlock()
	out["listener_calls"] = r.calls
	if fifo {
		outOfOrder := 0
		for g := 0; g < messageGroups; g++ {
			group := "mg-" + strconv.Itoa(g)
			var want, seen []string
			for _, b := range r.sentOrder {
				if r.groupOf[b] == group {
					want = append(want, b)
				}
			}
			dup := map[string]bool{}
			for _, b := range r.order[group] {
				if !dup[b] {
					dup[b] = true
					seen = append(seen, b)
				}
			}
			if len(seen) > len(want) || !reflect.DeepEqual(seen, want[:len(seen)]) {
				outOfOrder++
			}
		}
		out["out_of_order_groups"] = outOfOrder
	}
	return nil
}

func (r *run) simple(out map[string]any) error {
	consumer, err := rmq.NewSimpleConsumer(r.config(),
		rmq.WithSimpleAwaitDuration(5*time.Second),
		rmq.WithSimpleSubscriptionExpressions(r.subscription()),
	)
	if err != nil {
		return err
	}
	if err := consumer.Start(); err != nil {
		return err
	}
	defer consumer.GracefulStop()
	r.progress("simple consumer started")
	if err := r.send(false); err != nil {
		return err
	}
	bad, acked, ackErrors := 0, 0, 0
	start := time.Now()
	for !r.allReceived() && time.Since(start) < r.timeout {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		mvs, err := consumer.Receive(ctx, 16, 15*time.Second)
		cancel()
		if err != nil {
			// an empty long poll is an error to this client: only others are worth noting
			if !strings.Contains(err.Error(), "MESSAGE_NOT_FOUND") {
				r.fail("receive", err)
			}
			continue
		}
		for _, mv := range mvs {
			r.record(mv)
			if corrupted(mv) {
				bad++
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := consumer.Ack(ctx, mv); err != nil {
				ackErrors++
				r.fail("ack", err)
			} else {
				acked++
			}
			cancel()
		}
	}
	out["corrupted"] = bad
	out["acked"] = acked
	out["ack_errors"] = ackErrors
	return nil
}

func (r *run) run(scenario string) map[string]any {
	start := time.Now()
	out := map[string]any{
		"scenario": scenario, "endpoint": r.endpoint, "topic": r.name, "group": r.name,
	}
	var err error
	switch scenario {
	case "push":
		err = r.push(out, false)
	case "fifo-push":
		err = r.push(out, true)
	case "simple":
		err = r.simple(out)
	}
	if err != nil {
		r.fail(scenario, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	missing := []string{}
	for b := range r.sent {
		if !r.received[b] {
			missing = append(missing, label(b))
		}
	}
	sort.Strings(missing)
	leading := 0
	for _, b := range r.bodies {
		if strings.HasPrefix(crcHex(b), "0") {
			leading++
		}
	}
	distinct := []string{}
	seen := map[string]bool{}
	for _, e := range r.errors {
		if !seen[e] && len(distinct) < 5 {
			seen[e] = true
			distinct = append(distinct, e)
		}
	}
	out["sent"] = len(r.sent)
	out["leading_zero_crc"] = leading
	out["received"] = len(r.received)
	out["missing"] = len(missing)
	out["missing_bodies"] = missing
	out["unexpected"] = len(r.unexpected)
	out["error_count"] = len(r.errors)
	out["errors"] = distinct
	out["elapsed_ms"] = time.Since(start).Milliseconds()
	return out
}
