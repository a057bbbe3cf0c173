// sless Go runtime shim: the `main` of a Go function, serving it over the sless instance
// protocol (docs/instance-protocol.md).
//
// The builder copies this file next to the user's handler.go (both are `package main`), writes a
// small file that registers the entrypoint (`Handle`, or `HandleContext` when the code has one)
// with slessUsePlain / slessUseContext, and compiles the lot into one static binary. Every name
// this file declares starts with `sless` or `Sless`, so it stays out of the user's way.
//
// Standard library only, Go 1.19. `--check` exits 0 at once (the compiler has checked what a
// load would). Outside the sandbox SLESS_SOCKET names the socket to listen on.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// slessExitLoad: no handler was registered (the platform reports a load error).
	slessExitLoad = 3
	// slessExitServe: the socket could not be used or the server failed.
	slessExitServe = 2
	// slessMaxResult: the platform refuses larger answers, so the shim says why instead.
	slessMaxResult = 256 << 20
	// slessShutdownGrace: how long in-flight requests may run after SIGTERM.
	slessShutdownGrace = 10 * time.Second
)

// slessHandler is the function's entrypoint, set by the generated registration file.
var slessHandler func(context.Context, map[string]any) (any, error)

// slessUsePlain registers `func Handle(event map[string]any) (any, error)`.
func slessUsePlain(f func(map[string]any) (any, error)) bool {
	slessHandler = func(_ context.Context, event map[string]any) (any, error) { return f(event) }
	return true
}

// slessUseContext registers `func HandleContext(ctx context.Context, event map[string]any) (any, error)`.
func slessUseContext(f func(context.Context, map[string]any) (any, error)) bool {
	slessHandler = f
	return true
}

// SlessContext describes the request a handler runs for; get it with SlessContextFrom(ctx).
type SlessContext struct {
	RequestID    string
	Source       string
	FunctionName string
	Namespace    string
	Revision     string
	// DeadlineMs is the deadline as Unix milliseconds, 0 without one (ctx.Deadline() has it too).
	DeadlineMs int64
	// Message is the delivery's message as JSON (queue and device triggers, async calls), else nil.
	Message json.RawMessage
	// Attempt is the delivery's attempt, 0 when not a delivery.
	Attempt int
}

type slessContextKey struct{}

// SlessContextFrom returns the request's SlessContext (zero outside a request).
func SlessContextFrom(ctx context.Context) SlessContext {
	c, _ := ctx.Value(slessContextKey{}).(SlessContext)
	return c
}

func slessLog(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "sless: "+format+"\n", args...)
}

// slessServer answers the instance protocol for one handler.
type slessServer struct {
	handler func(context.Context, map[string]any) (any, error)
	// slots bounds the calls running at once (SLESS_CONCURRENCY).
	slots chan struct{}
}

func (s *slessServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/_sless/ready":
		if r.Method != http.MethodGet {
			slessAnswer(w, http.StatusMethodNotAllowed, []byte(`{"error":"method not allowed"}`))
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		slessAnswer(w, http.StatusOK, []byte("ok"))
	case "/_sless/invoke":
		if r.Method != http.MethodPost {
			slessAnswer(w, http.StatusMethodNotAllowed, []byte(`{"error":"method not allowed"}`))
			return
		}
		s.invoke(w, r)
	case "/_sless/load":
		// A Go function is its own binary: there are no generic Go instances to load into.
		slessError(w, http.StatusConflict, "a function is already loaded")
	default:
		slessAnswer(w, http.StatusNotFound, []byte(`{"error":"not found"}`))
	}
}

func (s *slessServer) invoke(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		slessError(w, http.StatusBadRequest, "cannot read the event: "+err.Error())
		return
	}
	var event map[string]any
	if len(strings.TrimSpace(string(body))) > 0 {
		var decoded any
		if err := json.Unmarshal(body, &decoded); err != nil {
			slessError(w, http.StatusBadRequest, "invalid JSON event: "+err.Error())
			return
		}
		switch v := decoded.(type) {
		case nil:
		case map[string]any:
			event = v
		default:
			slessError(w, http.StatusBadRequest, fmt.Sprintf("invalid JSON event: a Go handler takes a JSON object, got %T", v))
			return
		}
	}
	info := SlessContext{
		RequestID:    r.Header.Get("x-sless-request-id"),
		Source:       r.Header.Get("x-sless-source"),
		FunctionName: os.Getenv("SLESS_FUNCTION"),
		Namespace:    os.Getenv("SLESS_NAMESPACE"),
		Revision:     os.Getenv("SLESS_REVISION"),
	}
	ctx := context.Background()
	if raw := r.Header.Get("x-sless-deadline-ms"); raw != "" {
		if ms, err := strconv.ParseInt(raw, 10, 64); err == nil {
			info.DeadlineMs = ms
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, time.UnixMilli(ms))
			defer cancel()
		}
	}
	if raw := r.Header.Get("x-sless-message"); raw != "" && json.Valid([]byte(raw)) {
		info.Message = json.RawMessage(raw)
		var m struct {
			Attempt int `json:"attempt"`
		}
		if json.Unmarshal(info.Message, &m) == nil {
			info.Attempt = m.Attempt
		}
	}
	ctx = context.WithValue(ctx, slessContextKey{}, info)

	s.slots <- struct{}{}
	result, err := s.call(ctx, info.RequestID, event)
	<-s.slots
	if err != nil {
		slessError(w, http.StatusInternalServerError, err.Error())
		return
	}
	encoded, err := json.Marshal(result)
	if err != nil {
		slessError(w, http.StatusInternalServerError, "result is not JSON serializable: "+err.Error())
		return
	}
	if len(encoded) > slessMaxResult {
		slessError(w, http.StatusInternalServerError, fmt.Sprintf("result is too large: %d bytes", len(encoded)))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	slessAnswer(w, http.StatusOK, encoded)
}

// call runs the handler, turning a panic into an error so the instance keeps serving.
func (s *slessServer) call(ctx context.Context, requestID string, event map[string]any) (result any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
			lines := strings.Split(strings.TrimRight(fmt.Sprintf("panic: %v\n\n%s", p, debug.Stack()), "\n"), "\n")
			var out strings.Builder
			for _, line := range lines {
				out.WriteString("[" + requestID + "] " + line + "\n")
			}
			os.Stderr.WriteString(out.String())
		}
	}()
	result, err = s.handler(ctx, event)
	if err != nil {
		msg := err.Error()
		if msg == "" {
			msg = fmt.Sprintf("%T", err)
		}
		return nil, errors.New(msg)
	}
	return result, nil
}

func slessAnswer(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/json")
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func slessError(w http.ResponseWriter, status int, message string) {
	body, _ := json.Marshal(map[string]string{"error": message})
	w.Header().Set("Content-Type", "application/json")
	slessAnswer(w, status, body)
}

// slessListen returns the listener the platform passed (SLESS_LISTEN_FD) or binds SLESS_SOCKET.
func slessListen() (net.Listener, error) {
	if raw := os.Getenv("SLESS_LISTEN_FD"); raw != "" {
		fd, err := strconv.Atoi(raw)
		if err != nil {
			return nil, fmt.Errorf("SLESS_LISTEN_FD=%q is not a descriptor", raw)
		}
		f := os.NewFile(uintptr(fd), "listen")
		defer f.Close()
		return net.FileListener(f)
	}
	if path := os.Getenv("SLESS_SOCKET"); path != "" {
		if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(path)
		}
		l, err := net.Listen("unix", path)
		if err != nil {
			return nil, err
		}
		// Go removes the socket file when the listener closes.
		return l, nil
	}
	return nil, errors.New("neither SLESS_LISTEN_FD nor SLESS_SOCKET is set")
}

func slessConcurrency() int {
	n, err := strconv.Atoi(os.Getenv("SLESS_CONCURRENCY"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--check" {
		if slessHandler == nil {
			slessLog("no handler registered")
			os.Exit(slessExitLoad)
		}
		os.Exit(0)
	}
	if slessHandler == nil {
		slessLog("no handler registered")
		os.Exit(slessExitLoad)
	}
	// Before the ready line: a SIGTERM right after it must stop the server cleanly.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	listener, err := slessListen()
	if err != nil {
		slessLog("cannot listen: %v", err)
		os.Exit(slessExitServe)
	}
	srv := &http.Server{
		Handler: &slessServer{handler: slessHandler, slots: make(chan struct{}, slessConcurrency())},
		// The platform's pool decides when connections close; the standard logger's lines
		// about broken connections go to stderr, which is the function's log.
		ReadHeaderTimeout: 0,
	}
	var served sync.WaitGroup
	served.Add(1)
	serveErr := make(chan error, 1)
	go func() {
		defer served.Done()
		serveErr <- srv.Serve(listener)
	}()
	if raw := os.Getenv("SLESS_READY_FD"); raw != "" {
		if fd, err := strconv.Atoi(raw); err == nil {
			f := os.NewFile(uintptr(fd), "ready")
			_, _ = f.WriteString("ready\n")
			_ = f.Close()
		}
	}
	select {
	case err := <-serveErr:
		slessLog("serving failed: %v", err)
		os.Exit(4)
	case <-stop:
		ctx, cancel := context.WithTimeout(context.Background(), slessShutdownGrace)
		defer cancel()
		_ = srv.Shutdown(ctx)
		served.Wait()
		os.Exit(0)
	}
}
