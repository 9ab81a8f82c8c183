package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
)

// Class is what the sink does about an error (DESIGN §7).
type Class int

const (
	// Transient errors (connection, serialization, deadlock, resources, shutdown, lock timeout) are
	// retried inside WriteBatch with backoff and never reach the input.
	Transient Class = iota
	// Data errors (SQLSTATE classes 21, 22, 23, 27, 44, 54, P0, an unreadable or too large payload)
	// belong to one message: it is isolated and reported to the input, which counts an attempt.
	Data
	// Environment errors (class 42, missing table, privileges, anything unknown) pause the sink:
	// retried with backoff and logged, never charged to a message.
	Environment
)

func (c Class) String() string {
	switch c {
	case Transient:
		return "transient"
	case Data:
		return "data"
	}
	return "environment"
}

// Classify sorts err by its SQLSTATE (or, without one, by what failed).
func Classify(err error) Class {
	if errcode.Is(err, errcode.BadPayload) || errcode.Is(err, errcode.PayloadTooLarge) {
		return Data
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return classifyCode(pgErr.Code)
	}
	if errcode.Lasting(err) {
		return Environment
	}
	// No SQLSTATE: a lost connection, a timeout, a refused dial: all transient.
	return Transient
}

func classifyCode(code string) Class {
	if len(code) < 2 {
		return Environment
	}
	switch code {
	case "40001", "40P01", "40003", "55P03", "25P02":
		return Transient
	}
	switch code[:2] {
	case "08", "53", "57", "58", "XX":
		return Transient
	case "21", "22", "23", "27", "44", "54", "P0":
		return Data
	}
	return Environment
}

// DataError formats a data error the way the dead-letter stream shows it:
// "SQLSTATE: message (detail)", or the coded bad_payload text for unreadable payloads.
func DataError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		msg := pgErr.Code + ": " + pgErr.Message
		if pgErr.Detail != "" {
			msg += " (" + pgErr.Detail + ")"
		}
		return errors.New(msg)
	}
	return err
}

// environmentError wraps an environment error in a code naming the fix.
func environmentError(err error) error {
	var coded *errcode.Error
	if errors.As(err, &coded) {
		return err
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return errcode.Wrap(errcode.SinkError, err, "the sink cannot write", "see the cause; the sink retries until it succeeds")
	}
	switch {
	case pgErr.Code == "25006":
		return pgconnect.ReadOnly(err)
	case pgErr.Code == "42P01":
		return errcode.Wrap(errcode.TargetMissing, err, "the target table is gone", "recreate the table; the sink retries")
	case pgErr.Code == "42501":
		return errcode.Wrap(errcode.TargetPrivileges, err, "permission denied", "grant the sink's user the privilege named in the error")
	case pgErr.Code == "0A000": // the one a sink's statement meets: TRUNCATE of a table another references
		return errcode.Wrap(errcode.TargetChanged, err, "the target table does not accept the sink's statement",
			"a TRUNCATE of a table that other tables reference (the detail names them) is refused unless they are truncated with it: "+
				"the source truncated them together, and their truncates reach the sink in another batch; truncate them in the target "+
				"and the sink goes on, and put the queue under pg_cdc's envelopes so that a transaction's truncates arrive together")
	case pgErr.Code == "42703", pgErr.Code == "42804", strings.HasPrefix(pgErr.Code, "42"):
		return errcode.Wrap(errcode.TargetChanged, err, "the target table does not accept the sink's statement",
			"fix the table or the config; the sink re-reads the table's shape and retries")
	}
	return errcode.Wrap(errcode.SinkError, err, fmt.Sprintf("the sink cannot write (SQLSTATE %s)", pgErr.Code),
		"see the cause; the sink retries until it succeeds")
}

// isCtxErr reports whether err is the caller's context ending.
func isCtxErr(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ctx.Err()))
}
