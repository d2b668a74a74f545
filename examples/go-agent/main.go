// Command go-agent is a worked dipam agent in Go: what a network agent does with dipamd at
// every start (docs/agent-api.md, "An agent's start-up and restart, worked through").
//
//  1. Wait until dipamd's Agent service is SERVING (it may start after the agent).
//  2. Turn the router and health roles on, and claim an egress address at a requested IP
//     with labels; all three are idempotent, so a restarted agent gets the same addresses.
//  3. Watch: one JSON line per list on stdout, across dipamd's restarts (SIGTERM or SIGKILL),
//     until SIGTERM or SIGINT.
//
// It is run by the test suite against a real dipamd that is SIGKILLed under it
// (agent_test.go, driven by tests/lifecycle/tests/agent/agent_api.rs).
//
//	go-agent --socket /run/dipam/dipam.sock --egress-ip 10.77.3.200 --label policy=web
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/health/grpc_health_v1"

	"example.invalid/dipam/api/agent"
	agentv1 "example.invalid/dipam/api/agent/v1"
)

// config is what the agent asks dipamd for.
type config struct {
	socket string
	roles  []string
	egress agent.ClaimSpec
}

// labels is a repeatable --label KEY=VALUE.
type labels map[string]string

func (l labels) String() string { return fmt.Sprint(map[string]string(l)) }

func (l labels) Set(kv string) error {
	k, v, ok := strings.Cut(kv, "=")
	if !ok {
		return fmt.Errorf("%q is not KEY=VALUE", kv)
	}
	l[k] = v
	return nil
}

func main() {
	cfg := config{roles: []string{"router", "health"}}
	l := labels{}
	flag.StringVar(&cfg.socket, "socket", agent.DefaultSocket, "dipamd's socket")
	flag.StringVar(&cfg.egress.Name, "egress-name", "egress-web", "the egress claim's name")
	flag.StringVar(&cfg.egress.IP, "egress-ip", "", "the egress IP to hold (empty: any)")
	flag.Var(l, "label", "a label of the egress claim, KEY=VALUE (repeatable)")
	flag.Parse()
	cfg.egress.Labels = l
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil && !errors.Is(err, context.Canceled) {
		log.Fatal(err)
	}
}

// run is the agent: start-up, then the watch, writing one line per list to out until ctx ends.
func run(ctx context.Context, cfg config, out io.Writer) error {
	c, err := agent.Dial(cfg.socket)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := waitServing(ctx, c); err != nil {
		return err
	}
	for _, role := range cfg.roles {
		if err := retry(ctx, func() error { _, err := c.Allocate(ctx, role); return err }); err != nil {
			return fmt.Errorf("allocate %s: %w", role, err)
		}
	}
	var claim *agentv1.ClaimReply
	err = retry(ctx, func() (err error) { claim, err = c.Claim(ctx, cfg.egress); return err })
	if errors.Is(err, agent.ErrAlreadyExists) {
		return fmt.Errorf("%s is claimed with another family or IP: unclaim it first: %w", cfg.egress.Name, err)
	} else if err != nil {
		return fmt.Errorf("claim %s: %w", cfg.egress.Name, err)
	}
	// FAILED and PENDING are outcomes, not errors: dipamd retries, and the watch shows it.
	log.Printf("claim %s: %s %s %s", cfg.egress.Name, claim.Claim.ClaimState, claim.Claim.Ip, claim.Claim.Message)

	enc := json.NewEncoder(out)
	onRetry := func(err error) { log.Printf("watch: %v; watching again", err) }
	return c.Watch(ctx, &agent.WatchOptions{OnRetry: onRetry}, func(s agent.Snapshot) error {
		// Program the datapath from the READY addresses here; this agent prints them.
		return enc.Encode(lineOf(s))
	})
}

// line is what the agent prints of one list.
type line struct {
	Instance   string    `json:"instance"`
	Generation uint64    `json:"generation"`
	Restarted  bool      `json:"restarted"`
	Addresses  []address `json:"addresses"`
}

type address struct {
	Name   string            `json:"name"`
	IP     string            `json:"ip"`
	State  string            `json:"state"`
	Labels map[string]string `json:"labels,omitempty"`
}

func lineOf(s agent.Snapshot) line {
	l := line{Instance: s.List.InstanceId, Generation: s.List.Generation, Restarted: s.Restarted}
	for _, a := range s.List.Addresses {
		l.Addresses = append(l.Addresses, address{a.Name, a.Ip, a.ClaimState.String(), a.Labels})
	}
	slices.SortFunc(l.Addresses, func(a, b address) int { return strings.Compare(a.Name, b.Name) })
	return l
}

// waitServing waits until dipamd's Agent service is SERVING: its addresses can be had.
func waitServing(ctx context.Context, c *agent.Client) error {
	health := grpc_health_v1.NewHealthClient(c.Conn())
	for {
		r, err := health.Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: "dipam.v1.Agent"})
		if err == nil && r.Status == grpc_health_v1.HealthCheckResponse_SERVING {
			return nil
		}
		log.Printf("waiting for dipamd: %v %v", r.GetStatus(), err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// retry calls f until it succeeds, fails for good, or ctx ends: dipamd may restart at any
// time, and every call is idempotent (docs/agent-api.md, "Idempotency").
func retry(ctx context.Context, f func() error) error {
	for wait := 100 * time.Millisecond; ; wait = min(wait*2, 5*time.Second) {
		err := f()
		var e *agent.Error
		if err == nil || !errors.As(err, &e) || !e.Retryable() || ctx.Err() != nil {
			return err
		}
		log.Printf("%v; retrying in %v", err, wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}
