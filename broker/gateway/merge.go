package main

// Concurrent SendMessage and AckMessage calls of one client become one wire request.
//
// The official clients send one message per SendMessage and acknowledge one message per
// AckMessage; the broker's cost is mostly per request (its checks, one store pass, one
// answer), so calls that wait together to be written leave as one request: no linger,
// only what queued while the previous write went out. Both requests are lists (a
// SendMessageRequest is its messages, field 1; an AckMessageRequest its group, topic and
// entries, fields 1-3), and the broker answers each element for itself, in order: its
// status and its entry. So a merged call's answer is cut back into one answer per call,
// each with its own entry and that entry's status, as the broker answers a lone call.
// A request-level answer (no entry per element: a refusal of the whole request) is not
// cut up: each call is then sent again alone and gets its own answer (a send is
// de-duplicated by its message id, so nothing is stored twice).

import (
	"bytes"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

const maxMerge = 64

// mergeableCall is a call that may share a request with its neighbours of the same key.
type mergeableCall struct {
	method   uint16
	key      string // method, hello, client id, and for an ack its group and topic
	hello    string
	clientID string
	prefix   []byte // an ack's group and topic fields; nothing for a send
	element  []byte // the one message (field 1) or ack entry (field 3), as encoded
	deadline time.Time
	reply    chan answer
}

// asMergeable says whether a request can be merged: a send of exactly one message, or an
// ack of exactly one entry (group, topic, entry, nothing else).
func asMergeable(method uint16, payload []byte) (prefix, element []byte, ok bool) {
	numbers, encoded, ok := fields(payload)
	if !ok {
		return nil, nil, false
	}
	switch method {
	case methodSend:
		if len(numbers) == 1 && numbers[0] == 1 {
			return nil, encoded[0], true
		}
	case methodAck:
		if len(numbers) == 3 && numbers[0] == 1 && numbers[1] == 2 && numbers[2] == 3 {
			return append(append([]byte(nil), encoded[0]...), encoded[1]...), encoded[2], true
		}
	}
	return nil, nil, false
}

// mergedCall is one wire request made of several calls.
type mergedCall struct {
	method  uint16
	members []*mergeableCall
}

// entryStatusField is the status field of each method's result entry
// (SendResultEntry.status = 1, AckMessageResultEntry.status = 3).
func entryStatusField(method uint16) protowire.Number {
	if method == methodAck {
		return 3
	}
	return 1
}

// split cuts the broker's answer to a merged request into one answer per member; ok false
// when the answer is not one entry per member (a refusal of the whole request).
func (m *mergedCall) split(body []byte) ([][]byte, bool) {
	numbers, encoded, ok := fields(body)
	if !ok {
		return nil, false
	}
	var entries [][]byte
	for i, number := range numbers {
		if number == 2 {
			entries = append(entries, encoded[i])
		}
	}
	if len(entries) != len(m.members) {
		return nil, false
	}
	statusNumber := entryStatusField(m.method)
	out := make([][]byte, len(entries))
	for i, entry := range entries {
		value, n := protowire.ConsumeBytes(entry[protowire.SizeTag(2):])
		if n < 0 {
			return nil, false
		}
		entryNumbers, entryFields, ok := fields(value)
		if !ok {
			return nil, false
		}
		var statusField []byte
		for j, number := range entryNumbers {
			if number == statusNumber {
				statusValue, n := protowire.ConsumeBytes(entryFields[j][protowire.SizeTag(statusNumber):])
				if n < 0 {
					return nil, false
				}
				statusField = field(1, statusValue)
			}
		}
		if statusField == nil {
			return nil, false
		}
		var answer bytes.Buffer
		answer.Write(statusField)
		answer.Write(entry)
		out[i] = answer.Bytes()
	}
	return out, true
}

// request is the merged request's payload: the ack's group and topic once, then every
// member's element in order.
func (m *mergedCall) request() []byte {
	size := len(m.members[0].prefix)
	for _, member := range m.members {
		size += len(member.element)
	}
	out := make([]byte, 0, size)
	out = append(out, m.members[0].prefix...)
	for _, member := range m.members {
		out = append(out, member.element...)
	}
	return out
}

// timeoutMs is the earliest member deadline, in milliseconds from now (0: none).
func (m *mergedCall) timeoutMs() uint32 {
	var earliest time.Time
	for _, member := range m.members {
		if !member.deadline.IsZero() && (earliest.IsZero() || member.deadline.Before(earliest)) {
			earliest = member.deadline
		}
	}
	return msUntil(earliest)
}

func msUntil(deadline time.Time) uint32 {
	if deadline.IsZero() {
		return 0
	}
	left := time.Until(deadline).Milliseconds()
	switch {
	case left < 1:
		return 1
	case left > 0xFFFFFFFF:
		return 0xFFFFFFFF
	}
	return uint32(left)
}
