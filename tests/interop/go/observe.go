// What the differential scenarios report, and how: outcomes, delivered messages and delays,
// free of ids and times.

package main

import (
	"fmt"
	"hash/crc32"
	"math"
	"regexp"
	"sort"
	"time"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
	v2 "github.com/apache/rocketmq-clients/golang/v5/protocol/v2"
	"google.golang.org/grpc/status"
)

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
