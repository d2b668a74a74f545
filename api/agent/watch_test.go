package agent

import (
	"testing"

	agentv1 "example.invalid/dipam/api/agent/v1"
)

// The resume rule: within one dipamd, only a higher generation is news (a reconnect to the
// same dipamd repeats its list); a new dipamd's first list is always news, and Restarted.
func TestResumeByInstanceAndGeneration(t *testing.T) {
	var r resume
	steps := []struct {
		instance  string
		gen       uint64
		news      bool
		restarted bool
	}{
		{"a", 5, true, false},
		{"a", 5, false, false}, // the same dipamd, reconnected: a repeat
		{"a", 4, false, false}, // older
		{"a", 6, true, false},
		{"b", 6, true, true}, // a new dipamd with nothing changed: still its full list
		{"b", 6, false, false},
		{"b", 9, true, false},
	}
	for i, s := range steps {
		got, news := r.take(&agentv1.AgentListReply{InstanceId: s.instance, Generation: s.gen})
		if news != s.news || got.Restarted != s.restarted {
			t.Errorf("step %d (%s, %d): news %v restarted %v, want %v %v", i, s.instance, s.gen, news, got.Restarted, s.news, s.restarted)
		}
	}
}
