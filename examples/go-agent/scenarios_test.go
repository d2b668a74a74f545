package main

import (
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"example.invalid/dipam/api/agent"
	agentv1 "example.invalid/dipam/api/agent/v1"
)

// step is one row of tests/lifecycle/agent-scenarios.json (its "about" says what each
// field means).
type step struct {
	Step            string            `json:"step"`
	Op              string            `json:"op"`
	Service         string            `json:"service"`
	Want            string            `json:"want"`
	Code            string            `json:"code"`
	Services        []string          `json:"services"`
	Methods         []string          `json:"methods"`
	Role            string            `json:"role"`
	Ready           bool              `json:"ready"`
	Name            string            `json:"name"`
	Family          string            `json:"family"`
	IP              string            `json:"ip"`
	Labels          map[string]string `json:"labels"`
	ClaimState      string            `json:"claim_state"`
	Watch           string            `json:"watch"`
	SameIPAs        string            `json:"same_ip_as"`
	Record          string            `json:"record"`
	ProtocolVersion *uint32           `json:"protocol_version"`
}

// scenario is the table's run: what it keeps from step to step.
type scenario struct {
	t       *testing.T
	c       *agent.Client
	subst   *strings.Replacer
	watch   *watcher
	listed  *agentv1.AgentListReply
	last    *agentv1.AgentListReply
	ips     map[string]string
	summary map[string]any
	codes   map[string]string
}

func TestScenarios(t *testing.T) {
	raw, err := os.ReadFile(env(t, "DIPAM_SCENARIOS"))
	if err != nil {
		t.Fatal(err)
	}
	var table struct{ Steps []step }
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	s := &scenario{
		t: t, c: dial(t),
		subst: strings.NewReplacer("{claim}", env(t, "DIPAM_CLAIM"), "{claim_ip}", env(t, "DIPAM_CLAIM_IP"),
			"{other_ip}", env(t, "DIPAM_OTHER_IP")),
		ips: map[string]string{}, summary: map[string]any{}, codes: map[string]string{},
	}
	var names []string
	for _, st := range table.Steps {
		st.Name, st.IP = s.subst.Replace(st.Name), s.subst.Replace(st.IP)
		s.step(st)
		names = append(names, st.Step)
	}
	if s.watch != nil {
		s.watch.stop()
	}
	s.summary["codes"] = s.codes
	s.summary["steps"] = names
	summary(t, "scenarios", s.summary)
}

// step runs one row: its call, then its expectations.
func (s *scenario) step(st step) {
	t := s.t
	got, err := s.call(st)
	if st.Code != "" {
		want := codeNames[st.Code]
		if status.Code(errors.Unwrap(err)) != want && status.Code(err) != want {
			t.Fatalf("%s: %v, want %s", st.Step, err, st.Code)
		}
		// The client package's own mapping, for the Agent service's calls.
		var e *agent.Error
		if errors.As(err, &e) && !errors.Is(err, sentinels[want]) {
			t.Fatalf("%s: %v is not %v", st.Step, err, sentinels[want])
		}
		s.codes[st.Step] = st.Code
		return
	}
	if err != nil {
		t.Fatalf("%s: %v", st.Step, err)
	}
	if st.Record != "" {
		s.summary[st.Record] = got
	}
	if st.Watch != "" {
		key := st.Name
		if key == "" {
			key = st.Role
		}
		present := st.Watch == "present"
		snap := s.watch.until(t, st.Step+": "+key+" "+st.Watch+" on the watch", func(r *agentv1.AgentListReply) bool {
			there, gone := false, true
			for _, a := range r.Addresses {
				if a.Name == key || a.Role == key {
					gone = false
					there = there || a.State == "ready"
				}
			}
			return (present && there) || (!present && gone)
		})
		s.last = snap.List
	}
}

// call makes the row's call: what it records, and its error.
func (s *scenario) call(st step) (any, error) {
	switch st.Op {
	case "health":
		return s.health(st)
	case "reflection":
		return s.reflection(st), nil
	case "list":
		return s.list(st)
	case "watch":
		return nil, s.openWatch()
	case "allocate":
		return s.allocate(st)
	case "release":
		_, err := s.c.Release(ctxFor(s.t), st.Role)
		return nil, err
	case "claim":
		return s.claim(st)
	case "unclaim":
		r, err := s.c.Unclaim(ctxFor(s.t), st.Name)
		if err == nil && r.Claim.ClaimState.String() != st.ClaimState {
			s.t.Fatalf("%s: %s %s", st.Step, r.Claim.ClaimState, r.Claim.Message)
		}
		return nil, err
	case "kill_dipamd":
		return s.restart(), nil
	}
	s.t.Fatalf("%s: unknown op %q", st.Step, st.Op)
	return nil, nil
}

func (s *scenario) health(st step) (any, error) {
	h := grpc_health_v1.NewHealthClient(s.c.Conn())
	r, err := h.Check(ctxFor(s.t), &grpc_health_v1.HealthCheckRequest{Service: st.Service})
	if err != nil {
		return nil, err
	}
	if got := r.Status.String(); got != st.Want {
		s.t.Fatalf("%s: %s, want %s", st.Step, got, st.Want)
	}
	s.summary["health"] = r.Status.String()
	return nil, nil
}

func (s *scenario) reflection(st step) []string {
	services, methods := reflectedAgent(s.t, s.c)
	for _, want := range st.Services {
		if !slices.Contains(services, want) {
			s.t.Fatalf("reflection lists %v, not %s", services, want)
		}
	}
	for _, want := range st.Methods {
		if !slices.Contains(methods, want) {
			s.t.Fatalf("reflection: Agent has %v, not %s", methods, want)
		}
	}
	slices.Sort(services)
	return services
}

func (s *scenario) list(st step) (any, error) {
	if st.ProtocolVersion != nil {
		// What a client that forgets protocol_version sends, through the generated client.
		_, err := s.c.Agent().List(ctxFor(s.t), &agentv1.AgentListRequest{ProtocolVersion: *st.ProtocolVersion})
		return nil, agent.MapError("List", err)
	}
	r, err := s.c.List(ctxFor(s.t))
	if err != nil {
		return nil, err
	}
	s.listed = r
	return rows(r), nil
}

func (s *scenario) openWatch() error {
	s.watch = watch(s.c)
	first := s.watch.next(s.t, "first watch message")
	if !slices.EqualFunc(rows(first.List), rows(s.listed), slices.Equal) {
		s.t.Fatalf("the watch began with %v, List said %v", rows(first.List), rows(s.listed))
	}
	if first.List.Generation < 1 {
		s.t.Fatalf("generation %d", first.List.Generation)
	}
	s.last = first.List
	return nil
}

func (s *scenario) allocate(st step) (any, error) {
	r, err := s.c.Allocate(ctxFor(s.t), st.Role)
	if err != nil {
		return nil, err
	}
	if st.Ready {
		mine := 0
		for _, a := range r.Addresses {
			if a.Role == st.Role {
				mine++
				if a.Ip == "" || a.State != "ready" {
					s.t.Fatalf("%s: %v", st.Step, rows(r))
				}
			}
		}
		if mine == 0 {
			s.t.Fatalf("%s: no %s address in %v", st.Step, st.Role, rows(r))
		}
	}
	l, err := s.c.List(ctxFor(s.t))
	if err != nil {
		return nil, err
	}
	return rows(l), nil
}

func (s *scenario) claim(st step) (any, error) {
	t := s.t
	family := agentv1.AddressFamily(agentv1.AddressFamily_value[st.Family])
	r, err := s.c.Claim(ctxFor(t), agent.ClaimSpec{Name: st.Name, Family: family, IP: st.IP, Labels: st.Labels})
	if err != nil {
		return nil, err
	}
	c := r.Claim
	if c.ClaimState.String() != st.ClaimState {
		t.Fatalf("%s: %s %s", st.Step, c.ClaimState, c.Message)
	}
	if ip, _, _ := strings.Cut(c.Ip, "/"); ip != st.IP || c.Name != st.Name || c.RequestedIp != st.IP {
		t.Fatalf("%s: got %v, asked for %s at %s", st.Step, c, st.Name, st.IP)
	}
	if len(c.Labels) != len(st.Labels) {
		t.Fatalf("%s: labels %v, want %v", st.Step, c.Labels, st.Labels)
	}
	for k, v := range st.Labels {
		if c.Labels[k] != v {
			t.Fatalf("%s: labels %v, want %v", st.Step, c.Labels, st.Labels)
		}
	}
	if c.AddressFamily != family || r.InstanceId == "" {
		t.Fatalf("%s: family %s, instance %q", st.Step, c.AddressFamily, r.InstanceId)
	}
	if st.SameIPAs != "" && c.Ip != s.ips[st.SameIPAs] {
		t.Fatalf("%s: %s, %s had %s", st.Step, c.Ip, st.SameIPAs, s.ips[st.SameIPAs])
	}
	s.ips[st.Step] = c.Ip
	if st.Record == "claim_listed" {
		l, err := s.c.List(ctxFor(t))
		if err != nil {
			return nil, err
		}
		return named(l), nil
	}
	return c.Ip, nil
}

// restart has dipamd SIGKILLed under the watch, which must give the next dipamd's list, the
// same addresses in it.
func (s *scenario) restart() any {
	t, before := s.t, s.last
	if len(before.Addresses) == 0 {
		t.Fatal("nothing to follow across the restart")
	}
	killDipamd(t)
	var first agent.Snapshot
	for !first.Restarted {
		first = s.watch.next(t, "the next dipamd's list")
	}
	if first.List.InstanceId == before.InstanceId {
		t.Fatalf("the restarted list has the old instance %s", before.InstanceId)
	}
	same := func(r *agentv1.AgentListReply) bool {
		return slices.EqualFunc(named(r), named(before), slices.Equal)
	}
	after := first
	if !same(first.List) {
		after = s.watch.until(t, "the same addresses after the restart", same)
	}
	s.last = after.List
	return map[string]any{"before": named(before), "after": named(after.List)}
}
