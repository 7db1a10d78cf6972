package main

import "fmt"

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
