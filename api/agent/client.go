package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "example.invalid/dipam/api/agent/v1"
)

// DefaultSocket is dipamd's socket unless its --socket says otherwise.
const DefaultSocket = "/run/dipam/dipam.sock"

// ProtocolVersion is the dipam.v1 protocol version this package speaks; every request
// carries it (docs/agent-api.md, "protocol_version").
const ProtocolVersion = 1

// Client calls dipamd's Agent service over its unix socket. It is safe for concurrent use.
type Client struct {
	conn *grpc.ClientConn
	rpc  agentv1.AgentClient
}

// Dial returns a client of the dipamd listening on socket (a path; relative paths are made
// absolute). Like grpc.NewClient it does not connect: the first call does, and a dipamd that
// is not there yet answers ErrUnavailable. opts come after the defaults (insecure
// transport credentials, since the socket's permissions are the access control; reconnection
// within 5 s), so they can override them.
func Dial(socket string, opts ...grpc.DialOption) (*Client, error) {
	abs, err := filepath.Abs(socket)
	if err != nil {
		return nil, fmt.Errorf("dipam: socket path %q: %w", socket, err)
	}
	// "unix:" and an absolute path: grpc-go then sends ":authority: localhost", and takes
	// "unix://relative" as a host name (grpc-go since 1.42).
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// grpc-go waits up to 120 s between attempts to reconnect by default: an agent
		// should find a restarted dipamd within seconds.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}, opts...)
	conn, err := grpc.NewClient("unix:"+abs, all...)
	if err != nil {
		return nil, fmt.Errorf("dipam: dial %s: %w", abs, err)
	}
	return &Client{conn: conn, rpc: agentv1.NewAgentClient(conn)}, nil
}

// Close closes the connection; a Watch running on it ends.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the underlying connection, for the other services dipamd serves on it
// (grpc.health.v1.Health, server reflection).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Agent is the generated client, for a call this package does not wrap.
func (c *Client) Agent() agentv1.AgentClient { return c.rpc }

// List returns every agent address dipamd manages, with its state.
func (c *Client) List(ctx context.Context) (*agentv1.AgentListReply, error) {
	r, err := c.rpc.List(ctx, &agentv1.AgentListRequest{ProtocolVersion: ProtocolVersion})
	return r, wrap("List", err)
}

// Allocate turns a role on (router, health, ingress) and answers once its addresses are
// allocated, with the whole list.
func (c *Client) Allocate(ctx context.Context, role string) (*agentv1.AgentListReply, error) {
	r, err := c.rpc.Allocate(ctx, &agentv1.AgentRoleRequest{ProtocolVersion: ProtocolVersion, Role: role})
	return r, wrap("Allocate", err)
}

// Release turns a role off: its addresses go back to the IPAM.
func (c *Client) Release(ctx context.Context, role string) (*agentv1.AgentListReply, error) {
	r, err := c.rpc.Release(ctx, &agentv1.AgentRoleRequest{ProtocolVersion: ProtocolVersion, Role: role})
	return r, wrap("Release", err)
}

// ClaimSpec is an address of the agent's own.
type ClaimSpec struct {
	// [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 bytes, unique per node and network.
	Name string
	// ADDRESS_FAMILY_UNSPECIFIED: IP's family, or IPv4.
	Family agentv1.AddressFamily
	// The address to hold, without prefix ("10.77.3.200"), or "" for any.
	IP string
	// What the address is for; at most 16.
	Labels map[string]string
}

// Claim claims a named address and answers once it is established; the reply's claim says
// the outcome (READY with its IP, FAILED or PENDING with the reason in Message). Claiming a
// name that exists with the same family and IP answers that claim (labels replaced).
func (c *Client) Claim(ctx context.Context, s ClaimSpec) (*agentv1.ClaimReply, error) {
	r, err := c.rpc.Claim(ctx, &agentv1.ClaimRequest{
		ProtocolVersion: ProtocolVersion,
		Name:            s.Name,
		Family:          s.Family,
		Ip:              s.IP,
		Labels:          s.Labels,
	})
	return r, wrap("Claim", err)
}

// Unclaim releases a claim and forgets it; an unknown name answers RELEASED.
func (c *Client) Unclaim(ctx context.Context, name string) (*agentv1.ClaimReply, error) {
	r, err := c.rpc.Unclaim(ctx, &agentv1.UnclaimRequest{ProtocolVersion: ProtocolVersion, Name: name})
	return r, wrap("Unclaim", err)
}
