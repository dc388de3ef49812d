package rmclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// ProtocolVersion is the wire protocol this client speaks.
const ProtocolVersion = 1

// Error is an error reply of the daemon: its JSON-RPC code, message and data.
type Error struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *Error) Error() string { return fmt.Sprintf("COD RM error %d: %s", e.Code, e.Message) }

// Codes the plugin reacts to (docs/protocol.md).
const (
	CodeNameTaken = -32021
	CodeAdmission = -32030
	CodeNotFound  = -32020
	// A write that may or may not take effect: not a refusal; the same request with the same
	// request_key on the same connection says which ("Write outcomes").
	CodeOutcomeUnknown = -32080
)

// ErrClosed is returned by calls on a connection that has closed.
var ErrClosed = errors.New("connection to the COD RM closed")

// Upcall is a notification the daemon sent: its method and raw params.
type Upcall struct {
	Method string
	Params json.RawMessage
	At     time.Time // when the frame was read
}

type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      *int64          `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *Error          `json:"error,omitempty"`
}

type request struct {
	JSONRPC string `json:"jsonrpc"`
	ID      int64  `json:"id"`
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
}

// Hello is the daemon's answer to hello (the fields the plugin uses).
type Hello struct {
	App        string `json:"app"`
	Privileged bool   `json:"privileged"`
	Epoch      int64  `json:"epoch"`
	Enforce    string `json:"enforce_mode"`
}

// Conn is one connection to the daemon. Calls may come from several goroutines;
// upcalls are delivered in order on Upcalls().
type Conn struct {
	sock    net.Conn
	writeMu sync.Mutex
	mu      sync.Mutex
	nextID  int64
	waiting map[int64]chan message
	upcalls chan Upcall
	done    chan struct{}
	err     error
	Hello   Hello
}

// Dial connects to the daemon's socket and says hello with the given application name.
func Dial(ctx context.Context, path, app string) (*Conn, error) {
	var d net.Dialer
	sock, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("no COD daemon answers on %s: %w", path, err)
	}
	c := &Conn{sock: sock, waiting: map[int64]chan message{}, upcalls: make(chan Upcall, 256), done: make(chan struct{})}
	go c.readLoop()
	params := map[string]any{"version": ProtocolVersion, "client": "cod-nri/0.1"}
	if app != "" {
		params["app"] = app
	}
	if err := c.Call(ctx, "hello", params, &c.Hello); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Upcalls delivers the daemon's notifications; it is closed when the connection ends.
func (c *Conn) Upcalls() <-chan Upcall { return c.upcalls }

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err says why the connection ended (after Done is closed).
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the connection; the daemon then forgets what it held (its tasks).
func (c *Conn) Close() error { return c.sock.Close() }

// Call sends one request and waits for its reply, decoding the result into out (may be nil).
func (c *Conn) Call(ctx context.Context, method string, params any, out any) error {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.nextID++
	id := c.nextID
	reply := make(chan message, 1)
	c.waiting[id] = reply
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiting, id)
		c.mu.Unlock()
	}()
	c.writeMu.Lock()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.sock.SetWriteDeadline(dl)
	}
	err := writeFrame(c.sock, request{JSONRPC: "2.0", ID: id, Method: method, Params: params})
	_ = c.sock.SetWriteDeadline(time.Time{})
	c.writeMu.Unlock()
	if err != nil {
		return fmt.Errorf("%s: sending: %w", method, err)
	}
	select {
	case m := <-reply:
		if m.Error != nil {
			return m.Error
		}
		if out != nil {
			if err := json.Unmarshal(m.Result, out); err != nil {
				return fmt.Errorf("%s: decoding the reply: %w", method, err)
			}
		}
		return nil
	case <-c.done:
		return c.Err()
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

func (c *Conn) readLoop() {
	var err error
	defer func() {
		c.mu.Lock()
		if err == nil {
			err = ErrClosed
		}
		c.err = fmt.Errorf("%w: %v", ErrClosed, err)
		c.mu.Unlock()
		close(c.done)
		close(c.upcalls)
	}()
	for {
		var body []byte
		body, err = readFrame(c.sock, MaxFrameBytes)
		if err != nil {
			return
		}
		at := time.Now()
		var m message
		if err = json.Unmarshal(body, &m); err != nil {
			return
		}
		if m.ID == nil {
			if m.Method != "" {
				c.upcalls <- Upcall{Method: m.Method, Params: m.Params, At: at}
			}
			continue
		}
		c.mu.Lock()
		ch := c.waiting[*m.ID]
		c.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
}
