package tree

import "testing"

func TestIntegrity(t *testing.T) {
	for _, tc := range []struct {
		mode Mode
		want bool
	}{
		{ModeIntegrity, true},
		{ModeWriteback, false},
		{"", false},
		{"Integrity", false},
	} {
		if got := (Tree{Mode: tc.mode}).Integrity(); got != tc.want {
			t.Errorf("Tree{Mode: %q}.Integrity() = %v, want %v", tc.mode, got, tc.want)
		}
	}
}
