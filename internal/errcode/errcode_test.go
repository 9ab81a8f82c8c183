package errcode

import (
	"errors"
	"fmt"
	"testing"
)

func TestErrorFormatAndIs(t *testing.T) {
	base := New("slot_lost", `slot "s" is gone`, "run pgrelay resync")
	cases := []struct {
		name string
		err  error
		code string
		want bool
	}{
		{"direct", base, "slot_lost", true},
		{"wrapped", fmt.Errorf("connect: %w", base), "slot_lost", true},
		{"as text", errors.New("failed to send: " + base.Error()), "slot_lost", true},
		{"other code", base, "fenced", false},
		{"nil", nil, "slot_lost", false},
		{"inner", Wrap("pointer_corrupt", New("slot_lost", "x", ""), "outer", ""), "slot_lost", true},
	}
	for _, c := range cases {
		if got := Is(c.err, c.code); got != c.want {
			t.Errorf("%s: Is = %v", c.name, got)
		}
	}
	if got := base.Error(); got != `slot_lost: slot "s" is gone. Fix: run pgrelay resync` {
		t.Fatalf("format: %s", got)
	}
	if Code(fmt.Errorf("x: %w", base)) != "slot_lost" {
		t.Fatal("Code")
	}
}
