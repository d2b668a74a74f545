package agent

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"

	agentv1 "example.invalid/dipam/api/agent/v1"
)

// Snapshot is one message of a watch: the whole list, never a delta.
type Snapshot struct {
	List *agentv1.AgentListReply
	// Restarted is set on the first message of a dipamd other than the previous message's
	// (a new instance_id): dipamd restarted, and this is its full list.
	Restarted bool
}

// WatchOptions tune [Client.Watch]; the zero value is what most agents want.
type WatchOptions struct {
	// The wait before reconnecting starts at MinBackoff (default 100 ms) and doubles up to
	// MaxBackoff (default 5 s); a message received resets it.
	MinBackoff, MaxBackoff time.Duration
	// OnRetry, when set, is told every error that ended a stream or an attempt to open one,
	// before the watch tries again (to log it, or count dipamd's restarts).
	OnRetry func(error)
}

// Watch calls fn with the list at once and again after every change, until ctx ends (it
// returns ctx's error), fn returns an error (returned as is), or dipamd refuses the watch for
// good ([ErrPermissionDenied], [ErrFailedPrecondition], [ErrUnimplemented], ...).
//
// A stream that ends because dipamd stopped or died, or that cannot be opened because dipamd
// is not there yet, is opened again with backoff. The watch resumes by (instance_id,
// generation): a message of the same dipamd with a generation fn has already been given is
// not given again; the first message of a new dipamd is given with Restarted set. Every
// message is the whole list, so nothing is lost while the watch was away.
func (c *Client) Watch(ctx context.Context, opts *WatchOptions, fn func(Snapshot) error) error {
	var o WatchOptions
	if opts != nil {
		o = *opts
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(5*time.Second, o.MinBackoff)
	}
	var r resume
	wait := o.MinBackoff
	for {
		got, err := c.watchOnce(ctx, &r, fn)
		if errors.Is(err, errStop) {
			return r.stop
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !watchRetries(err) {
			return err
		}
		if got {
			wait = o.MinBackoff
		}
		if o.OnRetry != nil {
			o.OnRetry(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, o.MaxBackoff)
	}
}

// errStop marks fn's own error, kept in resume.stop.
var errStop = errors.New("stopped by the watch function")

// resume is what a watch remembers across its streams.
type resume struct {
	seen     bool
	instance string
	gen      uint64
	stop     error
}

// take says whether msg is news, and remembers it if so.
func (r *resume) take(msg *agentv1.AgentListReply) (Snapshot, bool) {
	sameInstance := r.seen && msg.GetInstanceId() == r.instance
	if sameInstance && msg.GetGeneration() <= r.gen {
		return Snapshot{}, false
	}
	s := Snapshot{List: msg, Restarted: r.seen && !sameInstance}
	r.seen, r.instance, r.gen = true, msg.GetInstanceId(), msg.GetGeneration()
	return s, true
}

// watchOnce runs one stream to its end: whether it got a message, and the error that ended it
// (mapped; errStop when fn stopped it).
func (c *Client) watchOnce(ctx context.Context, r *resume, fn func(Snapshot) error) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.Watch(ctx, &agentv1.AgentListRequest{ProtocolVersion: ProtocolVersion})
	if err != nil {
		return false, wrap("Watch", err)
	}
	got := false
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			// dipamd ends a watch only when it stops; an orderly end is the same.
			return got, &Error{Op: "Watch", Code: codes.Unavailable, Message: "the stream ended", kind: ErrUnavailable}
		}
		if err != nil {
			return got, wrap("Watch", err)
		}
		got = true
		if s, news := r.take(msg); news {
			if err := fn(s); err != nil {
				r.stop = err
				return got, errStop
			}
		}
	}
}

// watchRetries says whether a watch goes on after err: dipamd away, stopping, busy or failing
// for now, or a connection lost mid-stream (UNKNOWN, as the plugin maps it too).
func watchRetries(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Retryable() || e.Code == codes.Unknown
}
