package errcode

import (
	"errors"
	"fmt"
	"testing"
)

func TestErrorFormatAndIs(t *testing.T) {
	base := New(SlotLost, `slot "s" is gone`, "run pgrelay resync")
	cases := []struct {
		name string
		err  error
		code Code
		want bool
	}{
		{"direct", base, SlotLost, true},
		{"wrapped", fmt.Errorf("connect: %w", base), SlotLost, true},
		{"joined", errors.Join(errors.New("other"), base), SlotLost, true},
		{"as text only", errors.New("failed to send: " + base.Error()), SlotLost, false},
		{"other code", base, Fenced, false},
		{"nil", nil, SlotLost, false},
		{"inner", Wrap(PointerCorrupt, New(SlotLost, "x", ""), "outer", ""), SlotLost, true},
		{"inner through fmt", Wrap(PointerCorrupt, fmt.Errorf("read: %w", New(SlotLost, "x", "")), "outer", ""), SlotLost, true},
	}
	for _, c := range cases {
		if got := Is(c.err, c.code); got != c.want {
			t.Errorf("%s: Is = %v", c.name, got)
		}
	}
	if got := base.Error(); got != `slot_lost: slot "s" is gone. Fix: run pgrelay resync` {
		t.Fatalf("format: %s", got)
	}
	if Of(fmt.Errorf("x: %w", base)) != SlotLost || Of(errors.New("x")) != "" {
		t.Fatal("Of")
	}
}
