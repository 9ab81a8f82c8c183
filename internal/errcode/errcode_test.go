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

// TestErrorEndsOneSentence: a cause whose text ends its sentence gets no second period before the
// fix (Redis' replies do: "NOAUTH Authentication required.").
func TestErrorEndsOneSentence(t *testing.T) {
	for _, c := range []struct {
		err  *Error
		want string
	}{
		{Wrap(RedisAuth, errors.New("NOAUTH Authentication required."), "Redis wants a password", "set it"),
			"redis_auth: Redis wants a password: NOAUTH Authentication required. Fix: set it"},
		{Wrap(RedisAuth, errors.New("WRONGPASS bad pair"), "refused", "set it"), "redis_auth: refused: WRONGPASS bad pair. Fix: set it"},
		{New(SlotLost, "gone.", "resync"), "slot_lost: gone. Fix: resync"},
		{New(SlotLost, "gone.", ""), "slot_lost: gone."},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
}

// TestTransient: only the codes of a server that does not answer pass by themselves.
func TestTransient(t *testing.T) {
	for code, want := range map[Code]bool{PGUnreachable: true, RedisUnreachable: true, PGPassword: false, PGDatabase: false,
		RedisAuth: false, SlotLost: false, Fenced: false, "": false} {
		if got := code.Transient(); got != want {
			t.Errorf("%q.Transient() = %v, want %v", code, got, want)
		}
	}
	for err, want := range map[error]bool{New(PGUnreachable, "x", ""): false, fmt.Errorf("start: %w", New(SlotLost, "x", "")): true,
		errors.New("reset"): false, nil: false} {
		if got := Lasting(err); got != want {
			t.Errorf("Lasting(%v) = %v, want %v", err, got, want)
		}
	}
}
