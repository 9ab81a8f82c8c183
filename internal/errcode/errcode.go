// Package errcode gives every error a user can cause a stable code and a sentence naming the fix.
//
// An Error prints as "<code>: <what happened>. Fix: <what to do>". Codes are the Code constants of
// codes.go, each documented in docs/errors.md (a test keeps the two equal); logs and metrics carry
// the code. Call sites name the constant, never a string literal (a test scans the repository).
//
// Is and Of find a code through error wrapping only, never in an error's text. That is enough across
// Benthos: an output's error reaches the input's ack function as the same value (a
// *service.BatchError keeps each message's error), which the fenced path from redis_queue to pg_cdc
// relies on and tests/errcode_ack_test.go proves.
package errcode

import (
	"errors"
	"strings"
)

// Error is a coded, user-facing error.
type Error struct {
	Code Code   // stable identifier, e.g. SlotLost
	Msg  string // what happened
	Fix  string // what the user should do
	Err  error  // the underlying cause, if any
}

// New returns a coded error.
func New(code Code, msg, fix string) *Error { return &Error{Code: code, Msg: msg, Fix: fix} }

// Wrap returns a coded error around a cause.
func Wrap(code Code, err error, msg, fix string) *Error {
	return &Error{Code: code, Msg: msg, Fix: fix, Err: err}
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(string(e.Code))
	b.WriteString(": ")
	b.WriteString(e.Msg)
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	if e.Fix != "" {
		if !strings.HasSuffix(b.String(), ".") { // a cause's own sentence ends with one
			b.WriteByte('.')
		}
		b.WriteString(" Fix: ")
		b.WriteString(e.Fix)
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether err, or any error it wraps, is an Error with code.
func Is(err error, code Code) bool {
	var e *Error
	for cur := err; errors.As(cur, &e); cur = e.Err {
		if e.Code == code {
			return true
		}
	}
	return false
}

// Lasting reports whether err is coded with a code that is not Transient: a condition that lasts
// until the user fixes it (a component reports it as an error, not as a lost connection).
func Lasting(err error) bool {
	code := Of(err)
	return code != "" && !code.Transient()
}

// Of returns the code of the outermost coded error in err's chain, or "".
func Of(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Retold returns err with its text replaced by text (a driver's message made readable before it is
// coded); errors.Is and errors.As see through it to err.
func Retold(err error, text string) error { return retold{err: err, text: text} }

type retold struct {
	err  error
	text string
}

func (r retold) Error() string { return r.text }
func (r retold) Unwrap() error { return r.err }
