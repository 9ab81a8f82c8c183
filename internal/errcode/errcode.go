// Package errcode gives every error a user can cause a stable code and a sentence naming the fix.
//
// An Error prints as "<code>: <what happened>. Fix: <what to do>". Codes are short snake_case words
// (slot_lost, fenced, bad_payload, ...) listed in docs/errors.md; logs and metrics carry the code.
// Is recognises a code through wrapping and, because Benthos may pass an output's error back to the
// input as text, also by its printed form.
package errcode

import (
	"errors"
	"strings"
)

// Error is a coded, user-facing error.
type Error struct {
	Code string // stable identifier, e.g. "slot_lost"
	Msg  string // what happened
	Fix  string // what the user should do
	Err  error  // the underlying cause, if any
}

// New returns a coded error.
func New(code, msg, fix string) *Error { return &Error{Code: code, Msg: msg, Fix: fix} }

// Wrap returns a coded error around a cause.
func Wrap(code string, err error, msg, fix string) *Error {
	return &Error{Code: code, Msg: msg, Fix: fix, Err: err}
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Code)
	b.WriteString(": ")
	b.WriteString(e.Msg)
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	if e.Fix != "" {
		b.WriteString(". Fix: ")
		b.WriteString(e.Fix)
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether err carries code, through wrapping or in its text.
func Is(err error, code string) bool {
	if err == nil {
		return false
	}
	var e *Error
	for cur := err; errors.As(cur, &e); cur = e.Err {
		if e.Code == code {
			return true
		}
		if e.Err == nil {
			break
		}
	}
	s := err.Error()
	return strings.HasPrefix(s, code+": ") || strings.Contains(s, " "+code+": ") || strings.Contains(s, ": "+code+": ")
}

// Code returns the code of the outermost coded error in err's chain, or "".
func Code(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}
