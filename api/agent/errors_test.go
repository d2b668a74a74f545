package agent

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Every code docs/agent-api.md lists maps to its sentinel, whatever the message says: a
// message that names another condition must not change the mapping.
func TestErrorsMapByCodeNotMessage(t *testing.T) {
	cases := []struct {
		code      codes.Code
		want      error
		retryable bool
	}{
		{codes.InvalidArgument, ErrInvalidArgument, false},
		{codes.AlreadyExists, ErrAlreadyExists, false},
		{codes.ResourceExhausted, ErrResourceExhausted, true},
		{codes.FailedPrecondition, ErrFailedPrecondition, false},
		{codes.PermissionDenied, ErrPermissionDenied, false},
		{codes.Unavailable, ErrUnavailable, true},
		{codes.DeadlineExceeded, ErrDeadlineExceeded, true},
		{codes.Canceled, ErrCanceled, false},
		{codes.Internal, ErrInternal, true},
		{codes.Unimplemented, ErrUnimplemented, false},
		{codes.DataLoss, ErrUnknown, false},
	}
	for _, c := range cases {
		err := wrap("Claim", status.Error(c.code, "permission denied: already exists, unavailable"))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v is not %v", c.code, err, c.want)
		}
		for _, other := range byCode {
			if other != c.want && errors.Is(err, other) {
				t.Errorf("%s: %v is also %v", c.code, err, other)
			}
		}
		var e *Error
		if !errors.As(err, &e) || e.Code != c.code || e.Retryable() != c.retryable {
			t.Errorf("%s: %#v, retryable want %v", c.code, e, c.retryable)
		}
		if st, ok := status.FromError(err); !ok || st.Code() != c.code {
			t.Errorf("%s: the status is not reachable through Unwrap: %v", c.code, st)
		}
	}
	if wrap("List", nil) != nil {
		t.Error("a nil error must stay nil")
	}
}
