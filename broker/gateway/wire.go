package main

// The broker's native wire (docs/wire.md): the MessagingService's unary calls as frames
// over one TCP connection. Frame header, big-endian: length u32 | request id u32 |
// method u16 | flags u16 | timeout ms u32; a request body is client id length u16 |
// client id | protobuf request. The first frame is HELLO, a JSON object of the calls'
// metadata headers; a later HELLO replaces it for the requests after it.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	headerSize   = 16
	flagError    = 0x1
	flagStatus   = 0x2 // with flagError: the body is a protocol Status (a refused hello)
	methodHello  = 0
	methodSend   = 3
	methodAck    = 5
	methodCancel = 0xFFFF
)

// answer is one frame's reply: a protobuf response, or the error the broker gave.
type answer struct {
	body []byte
	// refusal: the protocol Status that refused this caller's signature, to be answered
	// in-band as the broker's gRPC port answers it
	refusal []byte
	err     error
}

// errRefused carries a refused hello's Status to the call that sent it.
type errRefused struct{ status []byte }

func (e *errRefused) Error() string { return "the broker refused the call's signature" }

type wireConn struct {
	conn     net.Conn
	maxFrame int

	mu        sync.Mutex
	nextID    uint32
	pending   map[uint32]waiter
	hellos    map[uint32]struct{}
	sentHello string // the metadata the broker holds, as of the last frame written
	refusal   []byte // the Status that refused a later hello; the broker then closes
	closed    bool
	closeErr  error
	out       []item           // waiting for the writer, in the order the calls came
	held      []*mergeableCall // sends and acks waiting for a request in flight to end
	inflight  int              // requests of mergeable calls written and not yet answered
	wake      chan struct{}
	linger    time.Duration // a mergeable call's wait for others (--linger)
}

// maxMergedInFlight bounds the requests of mergeable calls (sends, acks) a connection has
// at the broker at once: while they are in flight, newer calls wait and leave together
// when one is answered, as Nagle's algorithm holds small segments. A lone call, or the
// first two, leave at once; under load each request carries what came meanwhile. Two, not
// one: the broker stores the next request while the last one's answer travels back.
const maxMergedInFlight = 2

// counted since the start, said when the gateway stops
var (
	callsPassed   atomic.Uint64 // calls passed over the wire
	mergedSent    atomic.Uint64 // merged requests written
	mergedMembers atomic.Uint64 // the calls they carried
	unmergedCalls atomic.Uint64 // calls sent again alone after their merged request was refused
)

// item is what waits to be written: a request (its frame, and the metadata it must be
// read under: "" for a CANCEL), or a call that may share a request.
type item struct {
	frame []byte
	hello string
	merge *mergeableCall
}

// waiter is what a request's answer goes to: one call, or the calls of a mergeable
// request (counted in `inflight`: one call alone, or several).
type waiter struct {
	reply  chan answer
	merged *mergedCall
}

type helloReply struct {
	Version  int `json:"version"`
	MaxFrame int `json:"max_frame"`
}

// dialWire connects and says hello with `hello`, waiting for the answer: a refusal is
// returned as *errRefused, so the caller answers its call with the broker's own status.
func dialWire(ctx context.Context, address string, tlsConfig *tls.Config, hello string, linger time.Duration) (*wireConn, error) {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	var conn net.Conn
	var err error
	if tlsConfig != nil {
		conn, err = (&tls.Dialer{NetDialer: dialer, Config: tlsConfig}).DialContext(ctx, "tcp", address)
	} else {
		conn, err = dialer.DialContext(ctx, "tcp", address)
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "the broker's wire %s: %v", address, err)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetNoDelay(true)
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	if _, err := conn.Write(makeFrame(0, methodHello, 0, 0, []byte(hello))); err != nil {
		conn.Close()
		return nil, status.Errorf(codes.Unavailable, "the broker's wire %s: %v", address, err)
	}
	reader := bufio.NewReaderSize(conn, 256<<10)
	_, flags, body, err := readFrame(reader)
	if err != nil {
		conn.Close()
		return nil, status.Errorf(codes.Unavailable, "the broker's wire %s: hello: %v", address, err)
	}
	if flags&flagError != 0 {
		conn.Close()
		if flags&flagStatus != 0 {
			return nil, &errRefused{status: body}
		}
		return nil, errorStatus(body)
	}
	var reply helloReply
	if err := json.Unmarshal(body, &reply); err != nil {
		conn.Close()
		return nil, status.Errorf(codes.Unavailable, "the broker's wire %s: hello answer: %v", address, err)
	}
	_ = conn.SetDeadline(time.Time{})
	w := &wireConn{
		conn:      conn,
		maxFrame:  reply.MaxFrame,
		nextID:    1,
		pending:   make(map[uint32]waiter),
		hellos:    make(map[uint32]struct{}),
		sentHello: hello,
		wake:      make(chan struct{}, 1),
		linger:    linger,
	}
	go w.writeLoop()
	go w.readLoop(reader)
	return w, nil
}

func makeFrame(requestID uint32, method, flags uint16, timeoutMs uint32, body []byte) []byte {
	out := make([]byte, headerSize+len(body))
	binary.BigEndian.PutUint32(out[0:], uint32(len(body)))
	binary.BigEndian.PutUint32(out[4:], requestID)
	binary.BigEndian.PutUint16(out[8:], method)
	binary.BigEndian.PutUint16(out[10:], flags)
	binary.BigEndian.PutUint32(out[12:], timeoutMs)
	copy(out[headerSize:], body)
	return out
}

func readFrame(r *bufio.Reader) (uint32, uint16, []byte, error) {
	var head [headerSize]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, 0, nil, err
	}
	length := binary.BigEndian.Uint32(head[0:])
	body := make([]byte, length)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, 0, nil, err
	}
	return binary.BigEndian.Uint32(head[4:]), binary.BigEndian.Uint16(head[10:]), body, nil
}

// errorStatus reads an ERROR frame's "<status code name>\n<details>".
func errorStatus(body []byte) error {
	name, details, _ := strings.Cut(string(body), "\n")
	code, ok := codeByName[name]
	if !ok {
		code = codes.Unknown
	}
	return status.Error(code, details)
}

var codeByName = func() map[string]codes.Code {
	out := make(map[string]codes.Code)
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		// codes.Code.String() gives "DeadlineExceeded"; the broker sends "DEADLINE_EXCEEDED"
		out[upperSnake(c.String())] = c
	}
	return out
}()

func upperSnake(camel string) string {
	var b strings.Builder
	for i, r := range camel {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

// call sends one request and waits for its answer; when ctx ends first the broker is told
// (CANCEL) and the call ends with ctx's status, as a gRPC call would. A send of one
// message or an ack of one entry may share its request with others (merge.go).
func (w *wireConn) call(ctx context.Context, method uint16, hello, clientID string, payload []byte) answer {
	if w.maxFrame > 0 && 2+len(clientID)+len(payload) > w.maxFrame {
		return answer{err: status.Errorf(codes.ResourceExhausted,
			"request of %d bytes is over the broker's limit of %d", len(payload), w.maxFrame)}
	}
	deadline, _ := ctx.Deadline()
	if !deadline.IsZero() && time.Until(deadline) < time.Millisecond {
		return answer{err: status.Error(codes.DeadlineExceeded, "the call's deadline passed")}
	}
	callsPassed.Add(1)
	reply := make(chan answer, 1)
	prefix, element, mergeable := asMergeable(method, payload)
	var id uint32

	w.mu.Lock()
	if w.closed {
		err := w.closeErr
		w.mu.Unlock()
		return answer{err: err}
	}
	if mergeable {
		key := string(rune(method)) + "\x00" + hello + "\x00" + clientID + "\x00" + string(prefix)
		w.out = append(w.out, item{merge: &mergeableCall{
			method: method, key: key, hello: hello, clientID: clientID,
			prefix: prefix, element: element, deadline: deadline, reply: reply,
		}})
	} else {
		id = w.newID()
		w.pending[id] = waiter{reply: reply}
		w.out = append(w.out, item{frame: requestFrame(id, method, msUntil(deadline), clientID, payload), hello: hello})
	}
	w.mu.Unlock()
	w.signal()

	select {
	case a := <-reply:
		return a
	case <-ctx.Done():
		if !mergeable { // a merged request goes on for the others; this answer is dropped
			w.mu.Lock()
			_, waiting := w.pending[id]
			if waiting && !w.closed {
				delete(w.pending, id)
				w.out = append(w.out, item{frame: makeFrame(id, methodCancel, 0, 0, nil)})
			}
			w.mu.Unlock()
			if waiting {
				w.signal()
			}
		}
		return answer{err: status.FromContextError(ctx.Err()).Err()}
	}
}

// sayHello appends a HELLO to `frames` when `hello` is not what the broker holds: the
// metadata a request is read under is the last HELLO written before it (the official
// clients sign every call, and the date moves each second). Called with w.mu held, in the
// order the frames are written.
func (w *wireConn) sayHello(frames [][]byte, hello string) [][]byte {
	if hello == "" || hello == w.sentHello {
		return frames
	}
	id := w.newID()
	w.hellos[id] = struct{}{}
	w.sentHello = hello
	return append(frames, makeFrame(id, methodHello, 0, 0, []byte(hello)))
}

func requestFrame(id uint32, method uint16, timeoutMs uint32, clientID string, payload []byte) []byte {
	body := make([]byte, 2+len(clientID)+len(payload))
	binary.BigEndian.PutUint16(body, uint16(len(clientID)))
	copy(body[2:], clientID)
	copy(body[2+len(clientID):], payload)
	return makeFrame(id, method, 0, timeoutMs, body)
}

func (w *wireConn) newID() uint32 {
	for {
		id := w.nextID
		w.nextID++
		if _, busy := w.pending[id]; !busy {
			if _, busy := w.hellos[id]; !busy {
				return id
			}
		}
	}
}

func (w *wireConn) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// writeLoop writes whatever frames are waiting in one system call: calls that arrive
// together leave together, and neighbouring sends (acks) of one client as one request.
func (w *wireConn) writeLoop() {
	for range w.wake {
		if w.linger > 0 {
			w.mu.Lock()
			mergeable := len(w.out) > 0 && w.out[len(w.out)-1].merge != nil
			w.mu.Unlock()
			if mergeable {
				time.Sleep(w.linger)
			}
		}
		w.mu.Lock()
		items := w.out
		w.out = nil
		closed := w.closed
		var frames [][]byte
		if !closed {
			frames = w.framesOf(items)
		}
		w.mu.Unlock()
		if closed {
			return
		}
		if len(frames) == 0 {
			continue
		}
		buffers := net.Buffers(frames)
		if _, err := buffers.WriteTo(w.conn); err != nil {
			w.fail(status.Errorf(codes.Unavailable, "the broker's wire: %v", err))
			return
		}
	}
}

// framesOf turns queued items into frames: each request as it came, each send or ack held
// until fewer than `maxMergedInFlight` of their requests are at the broker, then a run of
// held calls of one key (up to `maxMerge`) as one request. Registers what each frame's
// answer goes to. Called with w.mu held.
func (w *wireConn) framesOf(items []item) [][]byte {
	frames := make([][]byte, 0, len(items)+1)
	for _, it := range items {
		if it.merge != nil {
			w.held = append(w.held, it.merge)
			continue
		}
		frames = w.sayHello(frames, it.hello)
		frames = append(frames, it.frame)
	}
	for len(w.held) > 0 && w.inflight < maxMergedInFlight {
		first := w.held[0]
		n := 1
		for n < len(w.held) && n < maxMerge && w.held[n].key == first.key {
			n++
		}
		m := &mergedCall{method: first.method, members: append([]*mergeableCall(nil), w.held[:n]...)}
		w.held = w.held[n:]
		id := w.newID()
		w.pending[id] = waiter{merged: m}
		w.inflight++
		if n > 1 {
			mergedSent.Add(1)
			mergedMembers.Add(uint64(n))
		}
		frames = w.sayHello(frames, first.hello)
		frames = append(frames, requestFrame(id, m.method, m.timeoutMs(), first.clientID, m.request()))
	}
	if len(w.held) == 0 {
		w.held = nil
	}
	return frames
}

// unmerge sends each member of a merged request again alone: the broker refused the
// request as a whole, and each call gets the answer it would have got alone.
func (w *wireConn) unmerge(m *mergedCall) {
	w.mu.Lock()
	if w.closed {
		err := w.closeErr
		w.mu.Unlock()
		for _, member := range m.members {
			member.reply <- answer{err: err}
		}
		return
	}
	unmergedCalls.Add(uint64(len(m.members)))
	for _, member := range m.members {
		id := w.newID()
		w.pending[id] = waiter{reply: member.reply}
		payload := append(append([]byte(nil), member.prefix...), member.element...)
		frame := requestFrame(id, m.method, msUntil(member.deadline), member.clientID, payload)
		w.out = append(w.out, item{frame: frame, hello: member.hello})
	}
	w.mu.Unlock()
	w.signal()
}

func (w *wireConn) readLoop(reader *bufio.Reader) {
	for {
		id, flags, body, err := readFrame(reader)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				w.fail(status.Error(codes.Unavailable, "the broker closed the wire connection"))
			} else {
				w.fail(status.Errorf(codes.Unavailable, "the broker's wire: %v", err))
			}
			return
		}
		w.mu.Lock()
		if _, isHello := w.hellos[id]; isHello {
			delete(w.hellos, id)
			if flags&flagError != 0 && flags&flagStatus != 0 {
				w.refusal = body // the broker closes next: the calls after it get this status
			}
			w.mu.Unlock()
			continue
		}
		waiting, ok := w.pending[id]
		delete(w.pending, id)
		resume := false
		if ok && waiting.merged != nil {
			w.inflight--
			resume = len(w.held) > 0
		}
		w.mu.Unlock()
		if resume {
			w.signal() // the held calls leave now
		}
		switch {
		case !ok: // cancelled meanwhile
		case waiting.merged == nil && flags&flagError != 0:
			waiting.reply <- answer{err: errorStatus(body)}
		case waiting.merged == nil:
			waiting.reply <- answer{body: body}
		case flags&flagError != 0:
			err := errorStatus(body)
			for _, member := range waiting.merged.members {
				member.reply <- answer{err: err}
			}
		case len(waiting.merged.members) == 1: // alone: the answer as it is
			waiting.merged.members[0].reply <- answer{body: body}
		default:
			if parts, ok := waiting.merged.split(body); ok {
				for k, member := range waiting.merged.members {
					member.reply <- answer{body: parts[k]}
				}
			} else {
				w.unmerge(waiting.merged)
			}
		}
	}
}

// fail ends every waiting call: with the refusal's status when a hello was refused,
// UNAVAILABLE otherwise (the call may or may not have been carried out).
func (w *wireConn) fail(err error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	w.closeErr = err
	var replies []chan answer
	for _, waiting := range w.pending {
		if waiting.merged == nil {
			replies = append(replies, waiting.reply)
		} else {
			for _, member := range waiting.merged.members {
				replies = append(replies, member.reply)
			}
		}
	}
	for _, it := range w.out { // queued, not yet written
		if it.merge != nil {
			replies = append(replies, it.merge.reply)
		}
	}
	for _, held := range w.held {
		replies = append(replies, held.reply)
	}
	w.pending = map[uint32]waiter{}
	w.out = nil
	w.held = nil
	refusal := w.refusal
	w.mu.Unlock()
	w.conn.Close()
	w.signal()
	for _, reply := range replies {
		if refusal != nil {
			reply <- answer{refusal: refusal}
		} else {
			reply <- answer{err: err}
		}
	}
}

func (w *wireConn) close() {
	w.fail(status.Error(codes.Unavailable, "the client's connection closed"))
}

func (w *wireConn) isClosed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}
