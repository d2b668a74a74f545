package main

// The Go client against a real dipamd, run by tests/lifecycle/tests/agent/agent_api.rs (which
// starts dipamd with the roles router and health, builds this test with `go test -c` and
// runs it as root under the shipped unit's capabilities, and as a non-root --admin-uid):
//
//   - TestScenarios runs tests/lifecycle/agent-scenarios.json, the table the Python agent
//     runs too, through this module's client package;
//   - TestExampleSurvivesSigkill runs this example's agent (run) and has dipamd SIGKILLed
//     under its watch: the agent must see the next dipamd's list, with the same addresses.
//
// For each SIGKILL the test prints DIPAM-KILL and waits for a line on stdin; its findings go
// to stdout as a DIPAM-SUMMARY line of JSON. The settings come from the environment
// (DIPAM_SOCKET, DIPAM_SCENARIOS, DIPAM_CLAIM, DIPAM_CLAIM_IP, DIPAM_OTHER_IP,
// DIPAM_EXAMPLE_IP); a missing one fails the test, never skips it.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"example.invalid/dipam/api/agent"
	agentv1 "example.invalid/dipam/api/agent/v1"
)

const timeout = 30 * time.Second

func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: tests/lifecycle/tests/agent/agent_api.rs runs this test and sets it", name)
	}
	return v
}

// stdin is read by one reader for the whole binary (both tests wait on it).
var stdin = sync.OnceValue(func() *bufio.Reader { return bufio.NewReader(os.Stdin) })

// killDipamd asks the driving test to SIGKILL dipamd and start it again, and waits until it
// has.
func killDipamd(t *testing.T) {
	t.Helper()
	fmt.Println("DIPAM-KILL")
	l, err := stdin().ReadString('\n')
	if strings.TrimSpace(l) != "restarted" {
		t.Fatalf("the driving test did not restart dipamd: %q %v", l, err)
	}
}

func summary(t *testing.T, name string, v any) {
	b, err := json.Marshal(map[string]any{name: v})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("DIPAM-SUMMARY %s\n", b)
}

// codeNames are the codes of the scenario table, by the names every gRPC language shares.
var codeNames = map[string]codes.Code{
	"INVALID_ARGUMENT":    codes.InvalidArgument,
	"ALREADY_EXISTS":      codes.AlreadyExists,
	"FAILED_PRECONDITION": codes.FailedPrecondition,
	"NOT_FOUND":           codes.NotFound,
	"PERMISSION_DENIED":   codes.PermissionDenied,
}

// sentinels are the client package's errors for the codes the table expects of the Agent
// service: the mapping under test.
var sentinels = map[codes.Code]error{
	codes.InvalidArgument:    agent.ErrInvalidArgument,
	codes.AlreadyExists:      agent.ErrAlreadyExists,
	codes.FailedPrecondition: agent.ErrFailedPrecondition,
	codes.PermissionDenied:   agent.ErrPermissionDenied,
}

func nameOf(c codes.Code) string {
	for n, k := range codeNames {
		if k == c {
			return n
		}
	}
	return c.String()
}

// watcher is one Client.Watch run on its own goroutine, so that every wait has a bound.
type watcher struct {
	ch   chan agent.Snapshot
	done chan error
	stop context.CancelFunc
}

func watch(c *agent.Client) *watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{ch: make(chan agent.Snapshot, 64), done: make(chan error, 1), stop: cancel}
	go func() {
		w.done <- c.Watch(ctx, &agent.WatchOptions{MinBackoff: 50 * time.Millisecond}, func(s agent.Snapshot) error {
			w.ch <- s
			return nil
		})
	}()
	return w
}

func (w *watcher) next(t *testing.T, what string) agent.Snapshot {
	t.Helper()
	select {
	case s := <-w.ch:
		return s
	case err := <-w.done:
		t.Fatalf("%s: the watch ended: %v", what, err)
	case <-time.After(timeout):
		t.Fatalf("%s: no watch message within %v", what, timeout)
	}
	return agent.Snapshot{}
}

func (w *watcher) until(t *testing.T, what string, pred func(*agentv1.AgentListReply) bool) agent.Snapshot {
	t.Helper()
	for {
		if s := w.next(t, what); pred(s.List) {
			return s
		}
	}
}

// rows are (role, family, ip, state) of every address, sorted, as dipamctl lists them.
func rows(r *agentv1.AgentListReply) [][]string {
	var out [][]string
	for _, a := range r.Addresses {
		out = append(out, []string{a.Role, a.Family, a.Ip, a.State})
	}
	slices.SortFunc(out, func(a, b []string) int { return slices.Compare(a, b) })
	return out
}

// named are (name, ip, state) of every address, sorted.
func named(r *agentv1.AgentListReply) [][]string {
	var out [][]string
	for _, a := range r.Addresses {
		out = append(out, []string{a.Name, a.Ip, a.State})
	}
	slices.SortFunc(out, func(a, b []string) int { return slices.Compare(a, b) })
	return out
}

func dial(t *testing.T) *agent.Client {
	c, err := agent.Dial(env(t, "DIPAM_SOCKET"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// reflectedAgent lists the server's services and the Agent service's methods through server
// reflection, as grpcurl discovers them.
func reflectedAgent(t *testing.T, c *agent.Client) (services, methods []string) {
	stream, err := grpc_reflection_v1.NewServerReflectionClient(c.Conn()).ServerReflectionInfo(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	ask := func(r *grpc_reflection_v1.ServerReflectionRequest) *grpc_reflection_v1.ServerReflectionResponse {
		if err := stream.Send(r); err != nil {
			t.Fatal(err)
		}
		got, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	l := ask(&grpc_reflection_v1.ServerReflectionRequest{
		MessageRequest: &grpc_reflection_v1.ServerReflectionRequest_ListServices{},
	})
	for _, s := range l.GetListServicesResponse().GetService() {
		services = append(services, s.Name)
	}
	f := ask(&grpc_reflection_v1.ServerReflectionRequest{
		MessageRequest: &grpc_reflection_v1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "dipam.v1.Agent"},
	})
	for _, raw := range f.GetFileDescriptorResponse().GetFileDescriptorProto() {
		var fd descriptorpb.FileDescriptorProto
		if err := proto.Unmarshal(raw, &fd); err != nil {
			t.Fatal(err)
		}
		for _, s := range fd.Service {
			if fd.GetPackage()+"."+s.GetName() == "dipam.v1.Agent" {
				for _, m := range s.Method {
					methods = append(methods, m.GetName())
				}
			}
		}
	}
	return services, methods
}

// TestExampleSurvivesSigkill runs the example agent with dipamd SIGKILLed under its watch.
func TestExampleSurvivesSigkill(t *testing.T) {
	cfg := config{
		socket: env(t, "DIPAM_SOCKET"),
		roles:  []string{"router", "health"},
		egress: agent.ClaimSpec{Name: "egress-example", IP: env(t, "DIPAM_EXAMPLE_IP"),
			Labels: map[string]string{"policy": "web"}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, w := io.Pipe()
	ended := make(chan error, 1)
	go func() { ended <- run(ctx, cfg, w); w.Close() }()
	lines := json.NewDecoder(r)
	read := func(what string, pred func(line) bool) line {
		got := make(chan line)
		go func() {
			for {
				var l line
				if err := lines.Decode(&l); err != nil {
					close(got)
					return
				}
				if pred(l) {
					got <- l
					return
				}
			}
		}()
		select {
		case l, ok := <-got:
			if !ok {
				t.Fatalf("%s: the agent stopped: %v", what, <-ended)
			}
			return l
		case <-time.After(timeout):
			t.Fatalf("%s: not within %v", what, timeout)
		}
		return line{}
	}
	ready := func(l line) bool {
		names := map[string]bool{}
		for _, a := range l.Addresses {
			if a.State == "CLAIM_STATE_READY" && a.IP != "" {
				names[a.Name] = true
			}
		}
		return names["router-ipv4"] && names["health-ipv4"] && names["egress-example"]
	}
	before := read("router, health and the egress claim ready", ready)
	for _, a := range before.Addresses {
		if a.Name == "egress-example" && !strings.HasPrefix(a.IP, cfg.egress.IP+"/") {
			t.Fatalf("the egress claim holds %s, not %s", a.IP, cfg.egress.IP)
		}
	}
	killDipamd(t)
	restarted := read("the next dipamd's list", func(l line) bool { return l.Restarted })
	after := restarted
	if !ready(after) {
		after = read("the same addresses after the restart", ready)
	}
	if restarted.Instance == before.Instance {
		t.Fatalf("the list after the restart has the old instance %s", before.Instance)
	}
	if fmt.Sprint(after.Addresses) != fmt.Sprint(before.Addresses) {
		t.Fatalf("addresses before the SIGKILL %v, after %v", before.Addresses, after.Addresses)
	}
	cancel()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the agent ended with %v, not by its context", err)
	}
	// Nothing left behind: the lab checks that only the roles stay.
	c := dial(t)
	if _, err := c.Unclaim(ctxFor(t), "egress-example"); err != nil {
		t.Fatal(err)
	}
	summary(t, "example", map[string]any{"before": before, "after": after})
}
