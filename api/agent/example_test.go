package agent_test

import (
	"context"
	"errors"
	"log"
	"os/signal"
	"syscall"

	"example.invalid/dipam/api/agent"
	agentv1 "example.invalid/dipam/api/agent/v1"
)

// An agent's start-up: a router address, an egress address at a requested IP, and a watch
// that follows dipamd across its restarts (docs/agent-api.md has it line by line).
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	c, err := agent.Dial(agent.DefaultSocket)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Allocate(ctx, "router"); err != nil {
		log.Fatal(err)
	}
	r, err := c.Claim(ctx, agent.ClaimSpec{Name: "egress-web", IP: "10.77.3.200",
		Labels: map[string]string{"policy": "web"}})
	if errors.Is(err, agent.ErrAlreadyExists) {
		log.Fatal("egress-web is claimed with another IP: unclaim it first")
	} else if err != nil {
		log.Fatal(err)
	}
	log.Printf("egress-web: %s %s", r.Claim.ClaimState, r.Claim.Ip)
	err = c.Watch(ctx, nil, func(s agent.Snapshot) error {
		for _, a := range s.List.Addresses {
			if a.ClaimState == agentv1.ClaimState_CLAIM_STATE_READY {
				log.Printf("%s: %s (restarted: %v)", a.Name, a.Ip, s.Restarted)
			}
		}
		return nil
	})
	log.Print(err)
}
