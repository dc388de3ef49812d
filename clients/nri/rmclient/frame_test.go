package rmclient

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := writeFrame(&buf, map[string]any{"jsonrpc": "2.0", "id": 1, "method": "hello"}); err != nil {
		t.Fatal(err)
	}
	if n := binary.BigEndian.Uint32(buf.Bytes()[:4]); int(n) != buf.Len()-4 {
		t.Fatalf("length prefix %d, body %d bytes", n, buf.Len()-4)
	}
	body, err := readFrame(&buf, MaxFrameBytes)
	if err != nil || !strings.Contains(string(body), `"method":"hello"`) {
		t.Fatalf("read back %q, %v", body, err)
	}
}

func TestFrameLimits(t *testing.T) {
	if err := writeFrame(&bytes.Buffer{}, strings.Repeat("x", MaxFrameBytes)); err == nil {
		t.Fatal("an oversized frame was written")
	}
	var head [4]byte
	binary.BigEndian.PutUint32(head[:], MaxFrameBytes+1)
	if _, err := readFrame(bytes.NewReader(head[:]), MaxFrameBytes); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("an oversized length was not refused before its body: %v", err)
	}
	if _, err := readFrame(bytes.NewReader([]byte{0, 0, 0, 9, '{'}), MaxFrameBytes); err == nil {
		t.Fatal("a truncated frame was accepted")
	}
}
