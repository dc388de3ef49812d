// Package rmclient speaks the COD Resource Manager's wire protocol
// (docs/protocol.md): length-prefixed JSON-RPC 2.0 frames over a Unix socket,
// with upcalls interleaved with replies.
package rmclient

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
)

// MaxFrameBytes is the protocol's default frame limit (docs/protocol.md, "Transport and framing").
const MaxFrameBytes = 1 << 20

// writeFrame writes one frame: a 4-byte big-endian length, then the JSON body.
func writeFrame(w io.Writer, msg any) error {
	body, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("encoding a frame: %w", err)
	}
	if len(body) > MaxFrameBytes {
		return fmt.Errorf("frame of %d bytes exceeds the limit of %d bytes", len(body), MaxFrameBytes)
	}
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	_, err = w.Write(buf)
	return err
}

// readFrame reads one frame's body, refusing one larger than limit before reading it.
func readFrame(r io.Reader, limit int) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(head[:]))
	if n > limit {
		return nil, fmt.Errorf("frame of %d bytes exceeds the limit of %d bytes", n, limit)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return body, nil
}
