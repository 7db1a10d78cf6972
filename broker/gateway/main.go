// reliable-gateway: the RocketMQ 5 gRPC front end of `reliable broker start`.
//
// Official RocketMQ clients speak gRPC; a unary call costs the broker's Python gRPC stack
// several hundred microseconds of CPU, while the same request over the broker's native
// wire costs a fraction of that. The gateway serves the MessagingService over gRPC and
// passes each unary call, and the streaming ReceiveMessage as the wire's batch receive,
// to the broker over its native wire, its protobuf bytes untouched: the broker's servicer
// checks and answers it exactly as it would a call on its gRPC port. Everything else
// (Telemetry, the admin and health services, the extensions) is relayed to the broker's
// gRPC port as it is. Each client connection has its own wire connection, so a caller
// whose signature is refused affects no one else. docs/gateway.md.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

const service = "/apache.rocketmq.v2.MessagingService/"

// the wire's method codes (protocol/wire.py)
var wireMethods = map[string]uint16{
	service + "QueryRoute":                      1,
	service + "Heartbeat":                       2,
	service + "SendMessage":                     3,
	service + "QueryAssignment":                 4,
	service + "AckMessage":                      5,
	service + "ForwardMessageToDeadLetterQueue": 6,
	service + "EndTransaction":                  7,
	service + "NotifyClientTermination":         8,
	service + "ChangeInvisibleDuration":         9,
	service + "RecallMessage":                   10,
	service + "GetOffset":                       11,
	service + "QueryOffset":                     12,
	// the batch receive of the framework's transport (docs/wire.md), unary: as it is
	"/reliable.v1.BatchMessaging/ReceiveMessages": receiveMethod,
}

const (
	receivePath   = service + "ReceiveMessage"
	receiveMethod = 13 // reliable.v1.BatchMessaging/ReceiveMessages: the batch in one answer
	wireEndpoint  = "/reliable.v1.BatchMessaging/WireEndpoint"
	maxMessage    = 64 << 20 // the broker's own limits apply behind this one
	windowBytes   = 4 << 20
)

type gateway struct {
	wireAddress string
	wireTLS     *tls.Config
	linger      time.Duration
	upstream    *grpc.ClientConn
}

// link is one client connection and its wire connection, dialled at its first call.
type link struct {
	mu   sync.Mutex
	wire *wireConn
	done bool
}

type linkKey struct{}

// hello is the call's metadata as the wire's HELLO carries it: what the broker reads from
// a gRPC call's headers (signature, date, namespace, language), not the client id and
// request id (each request names its own) nor HTTP/2's and gRPC's own.
func hello(md metadata.MD) string {
	out := make(map[string]string, len(md))
	for key, values := range md {
		switch {
		case len(values) == 0, transportHeader(key), strings.HasSuffix(key, "-bin"),
			key == "x-mq-client-id", key == "x-mq-request-id":
			continue
		}
		out[key] = values[0]
	}
	text, _ := json.Marshal(out) // sorted keys: the same headers give the same hello
	return string(text)
}

// transportHeader says whether a header is HTTP/2's or gRPC's own, not the caller's.
func transportHeader(key string) bool {
	switch key {
	case "content-type", "user-agent", "te":
		return true
	}
	return strings.HasPrefix(key, ":") || strings.HasPrefix(key, "grpc-")
}

func (g *gateway) wireFor(ctx context.Context, helloText string) (*wireConn, error) {
	l, _ := ctx.Value(linkKey{}).(*link)
	if l == nil {
		return nil, status.Error(codes.Internal, "the gateway lost the call's connection")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return nil, status.Error(codes.Unavailable, "the client's connection closed")
	}
	if l.wire != nil && !l.wire.isClosed() {
		return l.wire, nil
	}
	dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	w, err := dialWire(dialCtx, g.wireAddress, g.wireTLS, helloText, g.linger)
	if err != nil {
		return nil, err
	}
	l.wire = w
	return w, nil
}

// call passes one request to the broker over the wire: the response bytes, or the
// in-band Status (field 1 of every MessagingService response) when the signature was
// refused, or a gRPC status error.
func (g *gateway) call(ctx context.Context, method uint16, payload []byte) ([]byte, []byte, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	helloText := hello(md)
	clientID := ""
	if ids := md.Get("x-mq-client-id"); len(ids) > 0 {
		clientID = ids[0]
	}
	w, err := g.wireFor(ctx, helloText)
	if err != nil {
		var refused *errRefused
		if errors.As(err, &refused) {
			return nil, refused.status, nil
		}
		return nil, nil, err
	}
	a := w.call(ctx, method, helloText, clientID, payload)
	return a.body, a.refusal, a.err
}

func timestampNow() []byte {
	now := time.Now()
	out := protowire.AppendTag(nil, 1, protowire.VarintType)
	out = protowire.AppendVarint(out, uint64(now.Unix()))
	out = protowire.AppendTag(out, 2, protowire.VarintType)
	return protowire.AppendVarint(out, uint64(now.Nanosecond()))
}

func (g *gateway) unary(stream grpc.ServerStream, method uint16) error {
	request := new(frame)
	if err := stream.RecvMsg(request); err != nil {
		return err
	}
	body, refusal, err := g.call(stream.Context(), method, request.payload)
	if err != nil {
		return err
	}
	if refusal != nil {
		body = field(1, refusal)
	}
	return stream.SendMsg(&frame{payload: body})
}

// receive answers the streaming ReceiveMessage from the wire's batch receive, in the
// stream's order: the status, each message, then the delivery timestamp. The batch's
// fields are numbered as ReceiveMessageResponse's (status 1, message 2, timestamp 3), so
// each field, as it is encoded, is one response of the stream.
func (g *gateway) receive(stream grpc.ServerStream) error {
	request := new(frame)
	if err := stream.RecvMsg(request); err != nil {
		return err
	}
	body, refusal, err := g.call(stream.Context(), receiveMethod, request.payload)
	if err != nil {
		return err
	}
	if refusal != nil {
		if err := stream.SendMsg(&frame{payload: field(1, refusal)}); err != nil {
			return err
		}
		return stream.SendMsg(&frame{payload: field(3, timestampNow())})
	}
	numbers, encoded, ok := fields(body)
	if !ok {
		return status.Error(codes.Internal, "the broker's receive answer is malformed")
	}
	var statusField, timestampField []byte
	var messages [][]byte
	for i, number := range numbers {
		switch number {
		case 1:
			statusField = encoded[i]
		case 2:
			messages = append(messages, encoded[i])
		case 3:
			timestampField = encoded[i]
		}
	}
	if statusField != nil {
		if err := stream.SendMsg(&frame{payload: statusField}); err != nil {
			return err
		}
	}
	for _, message := range messages {
		if err := stream.SendMsg(&frame{payload: message}); err != nil {
			return err
		}
	}
	if timestampField == nil {
		timestampField = field(3, timestampNow())
	}
	return stream.SendMsg(&frame{payload: timestampField})
}

// relay passes a call of any other method to the broker's gRPC port and back, frame by
// frame, with its headers and trailers.
func (g *gateway) relay(stream grpc.ServerStream, method string) error {
	ctx := stream.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	out := metadata.MD{}
	for key, values := range md {
		if !transportHeader(key) {
			out[key] = values
		}
	}
	upCtx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, out))
	defer cancel()
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	up, err := g.upstream.NewStream(upCtx, desc, method, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return err
	}
	sent := make(chan error, 1)
	go func() {
		for {
			f := new(frame)
			if err := stream.RecvMsg(f); err != nil {
				if errors.Is(err, io.EOF) {
					sent <- up.CloseSend()
				} else {
					sent <- err
				}
				return
			}
			if err := up.SendMsg(f); err != nil {
				sent <- nil // the answer's side reports what ended the call
				return
			}
		}
	}()
	header, err := up.Header()
	if err == nil && len(header) > 0 {
		_ = stream.SendHeader(header)
	}
	for {
		f := new(frame)
		if err := up.RecvMsg(f); err != nil {
			stream.SetTrailer(up.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := stream.SendMsg(f); err != nil {
			return err
		}
	}
}

func (g *gateway) handle(_ any, stream grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(stream)
	if !ok {
		return status.Error(codes.Internal, "no method")
	}
	if code, ok := wireMethods[method]; ok {
		return g.unary(stream, code)
	}
	if method == receivePath {
		return g.receive(stream)
	}
	return g.relay(stream, method)
}

// links follows the client connections: a connection's wire connection closes with it.
type links struct{}

func (links) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, linkKey{}, &link{})
}

func (links) HandleConn(ctx context.Context, s stats.ConnStats) {
	if _, end := s.(*stats.ConnEnd); !end {
		return
	}
	if l, _ := ctx.Value(linkKey{}).(*link); l != nil {
		l.mu.Lock()
		l.done = true
		w := l.wire
		l.mu.Unlock()
		if w != nil {
			w.close()
		}
	}
}

func (links) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (links) HandleRPC(context.Context, stats.RPCStats)                       {}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "reliable-gateway: "+format+"\n", args...)
	os.Exit(2)
}

// askWirePort asks the broker where its wire listens (reliable.v1.BatchMessaging/WireEndpoint).
func askWirePort(conn *grpc.ClientConn) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reply := new(frame)
	err := conn.Invoke(ctx, wireEndpoint, &frame{}, reply, grpc.ForceCodec(rawCodec{}), grpc.WaitForReady(true))
	if err != nil {
		return 0, err
	}
	var answer struct {
		Port  int    `json:"port"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(reply.payload, &answer); err != nil {
		return 0, fmt.Errorf("the answer is not JSON: %v", err)
	}
	if answer.Error != "" {
		return 0, errors.New(answer.Error)
	}
	if answer.Port == 0 {
		return 0, errors.New("the broker serves no native wire (--wire-port off)")
	}
	return answer.Port, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8081", "HOST:PORT to serve gRPC on (port 0: any free port)")
	broker := flag.String("broker", "", "the broker's gRPC endpoint HOST:PORT (required)")
	wire := flag.String("wire", "", "the broker's native wire HOST:PORT (default: asked from the broker)")
	certFile := flag.String("tls-cert", "", "serve TLS with this certificate (PEM; with --tls-key)")
	keyFile := flag.String("tls-key", "", "the certificate's private key (PEM)")
	brokerCA := flag.String("broker-ca", "", "reach the broker over TLS, trusting this CA (PEM)")
	linger := flag.Duration("linger", 0, "how long a send or ack waits for others to share its request (0: "+
		"none; those that queue while a write goes out still share it)")
	brokerName := flag.String("broker-server-name", "", "the name the broker's certificate is for (default: its host)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: reliable-gateway --broker HOST:PORT [--listen HOST:PORT] [options]\n\n"+
			"Serves the RocketMQ 5 gRPC protocol in front of `reliable broker start`, passing\n"+
			"the calls to the broker over its native wire (docs/gateway.md).\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *broker == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if *linger < 0 || *linger > time.Second {
		fail("--linger %v: between 0 and 1s", *linger)
	}
	if (*certFile == "") != (*keyFile == "") {
		fail("--tls-cert and --tls-key go together")
	}
	brokerHost, _, err := net.SplitHostPort(*broker)
	if err != nil {
		fail("--broker %q: %v", *broker, err)
	}

	var upstreamTLS *tls.Config
	upstreamCreds := insecure.NewCredentials()
	if *brokerCA != "" {
		pem, err := os.ReadFile(*brokerCA)
		if err != nil {
			fail("--broker-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fail("--broker-ca %s: no PEM certificate in it", *brokerCA)
		}
		name := *brokerName
		if name == "" {
			name = brokerHost
		}
		upstreamTLS = &tls.Config{RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS12}
		upstreamCreds = credentials.NewTLS(upstreamTLS)
	}
	upstream, err := grpc.NewClient(*broker,
		grpc.WithTransportCredentials(upstreamCreds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)))
	if err != nil {
		fail("--broker %q: %v", *broker, err)
	}

	wireAddress := *wire
	if wireAddress == "" {
		port, err := askWirePort(upstream)
		if err != nil {
			fail("the broker %s did not give its wire port (name it with --wire): %v", *broker, err)
		}
		wireAddress = net.JoinHostPort(brokerHost, strconv.Itoa(port))
	}

	options := []grpc.ServerOption{
		grpc.ForceServerCodec(rawCodec{}),
		grpc.UnknownServiceHandler((&gateway{wireAddress: wireAddress, wireTLS: upstreamTLS, upstream: upstream, linger: *linger}).handle),
		grpc.StatsHandler(links{}),
		grpc.MaxRecvMsgSize(maxMessage),
		grpc.MaxSendMsgSize(maxMessage),
		// fixed flow-control windows: with them grpc-go does not estimate the bandwidth-delay
		// product, whose PING with nearly every call a client then answers
		grpc.InitialWindowSize(windowBytes),
		grpc.InitialConnWindowSize(windowBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			fail("--tls-cert/--tls-key: %v", err)
		}
		options = append(options, grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	}
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		fail("--listen %s: %v", *listen, err)
	}
	server := grpc.NewServer(options...)
	fmt.Printf("reliable gateway: serving on %s (broker gRPC %s, native wire %s)\n",
		listener.Addr(), *broker, wireAddress)
	os.Stdout.Sync()

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-stop
		done := make(chan struct{})
		go func() { server.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			server.Stop()
		}
	}()
	if err := server.Serve(listener); err != nil {
		fail("%v", err)
	}
	fmt.Printf("reliable gateway: stopped; %d calls passed over the wire, %d merged requests "+
		"carried %d of them, %d sent again alone\n",
		callsPassed.Load(), mergedSent.Load(), mergedMembers.Load(), unmergedCalls.Load())
}
