// What the server answered to the calls whose answer the Go client does not pass on.
//
// The Go client's SimpleConsumer.Ack returns nil whatever status the server answers (it only
// counts a non-OK one in its metrics), so a refused ack looks accepted. The program reads the
// answer itself, with a gRPC interceptor on every connection the client opens, and reports
// it beside what the client said.

package main

import (
	"context"
	"sync"

	rmq "github.com/apache/rocketmq-clients/golang/v5"
	v2 "github.com/apache/rocketmq-clients/golang/v5/protocol/v2"
	"google.golang.org/grpc"
)

// answers holds the status code of every AckMessage answer, by receipt handle.
type answers struct {
	mu   sync.Mutex
	acks map[string]v2.Code
}

// recordAnswers makes every connection the client opens from now on report to the returned
// answers (the client makes its connections through the package's NewRpcClient).
func recordAnswers() *answers {
	a := &answers{acks: map[string]v2.Code{}}
	dial := rmq.NewRpcClient
	rmq.NewRpcClient = func(target string, opts ...rmq.RpcClientOption) (rmq.RpcClient, error) {
		intercept := rmq.WithDialOptions(grpc.WithChainUnaryInterceptor(a.intercept))
		return dial(target, append(opts, rmq.WithRpcClientConnOption(intercept))...)
	}
	return a
}

func (a *answers) intercept(ctx context.Context, method string, req, reply any,
	cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	request, isAck := req.(*v2.AckMessageRequest)
	response, ok := reply.(*v2.AckMessageResponse)
	if err == nil && isAck && ok {
		a.mu.Lock()
		for _, entry := range request.GetEntries() {
			a.acks[entry.GetReceiptHandle()] = response.GetStatus().GetCode()
		}
		a.mu.Unlock()
	}
	return err
}

// ack is the status the server answered to the last ack of a receipt handle (OK when none
// was seen: the call failed before an answer, which the client does report).
func (a *answers) ack(handle string) v2.Code {
	a.mu.Lock()
	defer a.mu.Unlock()
	code, seen := a.acks[handle]
	if !seen {
		return v2.Code_OK
	}
	return code
}
