package agent

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The errors a call returns, one per gRPC code dipamd answers with (docs/agent-api.md,
// "Errors"). Test with errors.Is(err, agent.ErrAlreadyExists); the mapping is by code only,
// since the messages are for people and change between releases.
var (
	// The request is wrong (an unknown role, a bad name, family, IP or label); retrying it
	// unchanged fails the same way.
	ErrInvalidArgument = errors.New("dipam: invalid argument")
	// Claim of a name that exists with another family or requested IP.
	ErrAlreadyExists = errors.New("dipam: already exists")
	// A value beyond its limit, too many claims or labels, or dipamd's admission queue is
	// full (retry with backoff).
	ErrResourceExhausted = errors.New("dipam: resource exhausted")
	// protocol_version unset or too old, or dipamd not configured for agent addresses.
	ErrFailedPrecondition = errors.New("dipam: failed precondition")
	// The caller's uid may not use the Agent service (root or dipamd's --admin-uid).
	ErrPermissionDenied = errors.New("dipam: permission denied")
	// dipamd is not there or is stopping: retry with backoff.
	ErrUnavailable = errors.New("dipam: unavailable")
	// The caller's deadline expired; what dipamd had accepted still runs to its end.
	ErrDeadlineExceeded = errors.New("dipam: deadline exceeded")
	// The caller cancelled the call.
	ErrCanceled = errors.New("dipam: canceled")
	// dipamd's ledger failed.
	ErrInternal = errors.New("dipam: internal")
	// The call is newer than this dipamd.
	ErrUnimplemented = errors.New("dipam: unimplemented")
	// Any other code.
	ErrUnknown = errors.New("dipam: unknown")
)

var byCode = map[codes.Code]error{
	codes.InvalidArgument:    ErrInvalidArgument,
	codes.AlreadyExists:      ErrAlreadyExists,
	codes.ResourceExhausted:  ErrResourceExhausted,
	codes.FailedPrecondition: ErrFailedPrecondition,
	codes.PermissionDenied:   ErrPermissionDenied,
	codes.Unavailable:        ErrUnavailable,
	codes.DeadlineExceeded:   ErrDeadlineExceeded,
	codes.Canceled:           ErrCanceled,
	codes.Internal:           ErrInternal,
	codes.Unimplemented:      ErrUnimplemented,
}

// Error is a call's failure: the operation, the gRPC code it mapped from, and dipamd's
// message (for people: never parse it).
type Error struct {
	Op      string
	Code    codes.Code
	Message string
	kind    error
	status  error
}

func (e *Error) Error() string {
	return fmt.Sprintf("dipam %s: %s: %s", e.Op, e.Code, e.Message)
}

// Is matches the sentinel of the error's code (ErrInvalidArgument, ...).
func (e *Error) Is(target error) bool { return target == e.kind }

// Unwrap gives the gRPC status error, for status.FromError and the like.
func (e *Error) Unwrap() error { return e.status }

// Retryable says whether the same call may succeed later unchanged: dipamd was away or busy,
// or the deadline was too short (every call is idempotent: docs/agent-api.md, "Idempotency").
func (e *Error) Retryable() bool {
	switch e.Code {
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded, codes.Internal:
		return true
	}
	return false
}

// MapError maps the error of a call made with the generated client ([Client.Agent]) as this
// package's own calls are mapped: an *[Error] by its gRPC code; nil stays nil.
func MapError(op string, err error) error { return wrap(op, err) }

// wrap maps a call's error by its gRPC code; nil stays nil.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	kind, ok := byCode[st.Code()]
	if !ok {
		kind = ErrUnknown
	}
	return &Error{Op: op, Code: st.Code(), Message: st.Message(), kind: kind, status: err}
}
