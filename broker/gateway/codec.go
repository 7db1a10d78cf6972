package main

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// frame is one gRPC message, its protobuf bytes untouched: the gateway decodes nothing it
// passes on, so a request reaches the broker's servicer exactly as the client encoded it.
type frame struct{ payload []byte }

// rawCodec moves frames through grpc-go without decoding them.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
	return f.payload, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	// grpc may reuse its buffer once Unmarshal returns
	f.payload = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// fields lists a message's top-level fields: number and whole encoding; ok false when it
// is not well-formed protobuf.
func fields(b []byte) (numbers []protowire.Number, encoded [][]byte, ok bool) {
	for len(b) > 0 {
		number, kind, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, false
		}
		size := protowire.ConsumeFieldValue(number, kind, b[n:])
		if size < 0 {
			return nil, nil, false
		}
		numbers = append(numbers, number)
		encoded = append(encoded, b[:n+size])
		b = b[n+size:]
	}
	return numbers, encoded, true
}

// field is one length-delimited field, encoded.
func field(number protowire.Number, value []byte) []byte {
	out := protowire.AppendTag(nil, number, protowire.BytesType)
	return protowire.AppendBytes(out, value)
}
