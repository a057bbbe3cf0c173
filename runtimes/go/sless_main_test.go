package main

// Builds the shim with a test handler into a binary, as the platform's builder does, starts it on
// a Unix socket and talks HTTP to it: readiness, results, errors, panics, context, concurrency.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const testHandler = `package main

import (
	"context"
	"errors"
	"time"
)

var barrier = make(chan struct{})
var release = make(chan struct{})

func init() {
	go func() {
		<-barrier
		<-barrier
		close(release)
	}()
}

func HandleContext(ctx context.Context, event map[string]any) (any, error) {
	switch event["do"] {
	case "error":
		return nil, errors.New("bad thing")
	case "panic":
		var m map[string]int
		m["x"] = 1
	case "context":
		info := SlessContextFrom(ctx)
		_, hasDeadline := ctx.Deadline()
		return map[string]any{"request_id": info.RequestID, "source": info.Source,
			"function": info.FunctionName, "deadline": hasDeadline, "attempt": info.Attempt}, nil
	case "barrier":
		// Answers only once two calls are inside the handler at the same time.
		barrier <- struct{}{}
		select {
		case <-release:
			return "together", nil
		case <-time.After(10 * time.Second):
			return nil, errors.New("alone")
		}
	case "unencodable":
		return func() {}, nil
	case "nil":
		return nil, nil
	}
	return map[string]any{"echo": event}, nil
}
`

const testEntry = "package main\n\nvar _ = slessUseContext(HandleContext)\n"

// buildShim compiles the shim with handler and entry into a binary in a temporary directory.
func buildShim(t *testing.T, handler, entry string) string {
	t.Helper()
	dir := t.TempDir()
	shim, err := os.ReadFile("sless_main.go")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"zz_sless_main.go":  string(shim),
		"zz_sless_entry.go": entry,
		"handler.go":        handler,
		"go.mod":            "module handler\n\ngo 1.19\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "handler")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

type instance struct {
	cmd    *exec.Cmd
	client *http.Client
	stderr *bytes.Buffer
}

func start(t *testing.T, bin string, env ...string) *instance {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "fn.sock")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"SLESS_SOCKET=" + sock, "SLESS_READY_FD=3", "SLESS_FUNCTION=fn"}, env...)
	cmd.ExtraFiles = []*os.File{w}
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	line := make([]byte, 6)
	if _, err := io.ReadFull(r, line); err != nil || string(line) != "ready\n" {
		t.Fatalf("no ready line (%v): %q; stderr: %s", err, line, stderr)
	}
	r.Close()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
	})
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	return &instance{cmd: cmd, client: client, stderr: stderr}
}

func (i *instance) post(t *testing.T, body string, headers map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://instance/_sless/invoke", strings.NewReader(body))
	req.Header.Set("x-sless-request-id", "req-1")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := i.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.ContentLength < 0 {
		t.Fatalf("answer without Content-Length")
	}
	return resp.StatusCode, string(out)
}

func TestServesTheProtocol(t *testing.T) {
	inst := start(t, buildShim(t, testHandler, testEntry), "SLESS_CONCURRENCY=4")

	resp, err := inst.client.Get("http://instance/_sless/ready")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("ready: %v %v", resp, err)
	}

	cases := []struct {
		body, want string
		status     int
	}{
		{`{"a":[1,"x",null,true]}`, `{"echo":{"a":[1,"x",null,true]}}`, 200},
		{``, `{"echo":null}`, 200},
		{`{"do":"error"}`, `{"error":"bad thing"}`, 500},
		{`{"do":"nil"}`, `null`, 200},
		{`{"do":"unencodable"}`, `{"error":"result is not JSON serializable: json: unsupported type: func()"}`, 500},
		{`[1]`, `{"error":"invalid JSON event: a Go handler takes a JSON object, got []interface {}"}`, 400},
		{`{`, `{"error":"invalid JSON event: unexpected end of JSON input"}`, 400},
	}
	for _, c := range cases {
		status, body := inst.post(t, c.body, nil)
		if status != c.status || body != c.want {
			t.Errorf("%s: got %d %s, want %d %s", c.body, status, body, c.status, c.want)
		}
	}
}

func TestAPanicIsA500AndTheInstanceKeepsServing(t *testing.T) {
	inst := start(t, buildShim(t, testHandler, testEntry))
	status, body := inst.post(t, `{"do":"panic"}`, nil)
	if status != 500 || !strings.Contains(body, "panic: assignment to entry in nil map") {
		t.Fatalf("got %d %s", status, body)
	}
	status, body = inst.post(t, `{"x":1}`, nil)
	if status != 200 || body != `{"echo":{"x":1}}` {
		t.Fatalf("after the panic: %d %s", status, body)
	}
	if !strings.Contains(inst.stderr.String(), "[req-1] panic: assignment to entry in nil map") {
		t.Fatalf("the panic is not in the log with its request id: %s", inst.stderr)
	}
}

func TestContextCarriesTheRequest(t *testing.T) {
	inst := start(t, buildShim(t, testHandler, testEntry))
	deadline := fmt.Sprint(time.Now().Add(time.Minute).UnixMilli())
	status, body := inst.post(t, `{"do":"context"}`, map[string]string{
		"x-sless-source": "queue", "x-sless-deadline-ms": deadline,
		"x-sless-message": `{"kind":"amqp","attempt":2}`,
	})
	var got map[string]any
	if err := json.Unmarshal([]byte(body), &got); status != 200 || err != nil {
		t.Fatalf("got %d %s", status, body)
	}
	want := map[string]any{"request_id": "req-1", "source": "queue", "function": "fn",
		"deadline": true, "attempt": float64(2)}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %v, want %v", k, got[k], v)
		}
	}
}

func TestCallsRunConcurrently(t *testing.T) {
	inst := start(t, buildShim(t, testHandler, testEntry), "SLESS_CONCURRENCY=4")
	done := make(chan string, 2)
	for i := 0; i < 2; i++ {
		go func() {
			_, body := inst.post(t, `{"do":"barrier"}`, nil)
			done <- body
		}()
	}
	for i := 0; i < 2; i++ {
		if body := <-done; body != `"together"` {
			t.Fatalf("got %s: the calls did not run side by side", body)
		}
	}
}

func TestAPlainHandleIsCalledWithTheEvent(t *testing.T) {
	handler := "package main\n\nfunc Handle(event map[string]any) (any, error) { return event[\"name\"], nil }\n"
	entry := "package main\n\nvar _ = slessUsePlain(Handle)\n"
	inst := start(t, buildShim(t, handler, entry))
	status, body := inst.post(t, `{"name":"go"}`, nil)
	if status != 200 || body != `"go"` {
		t.Fatalf("got %d %s", status, body)
	}
}

func TestSigtermEndsTheInstanceCleanly(t *testing.T) {
	inst := start(t, buildShim(t, testHandler, testEntry))
	if err := inst.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	state, err := inst.cmd.Process.Wait()
	if err != nil || state.ExitCode() != 0 {
		t.Fatalf("exit: %v %v", state, err)
	}
}

func TestCheckExitsZero(t *testing.T) {
	out, err := exec.Command(buildShim(t, testHandler, testEntry), "--check").CombinedOutput()
	if err != nil || len(out) != 0 {
		t.Fatalf("--check: %v %q", err, out)
	}
}
