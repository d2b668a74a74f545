// libcni-driver runs one CNI operation through libcni's Go API (github.com/containernetworking/cni
// libcni), the library containerd and CRI-O build on, and prints the outcome as JSON. dipam's
// lifecycle tests use it to drive dipam the way a real runtime does. cnitool, libcni's own
// client, cannot pass a GC valid list, which is why this driver exists.
//
// The request is one JSON object on stdin:
//
//	{"op": "add"|"check"|"del"|"gc"|"status"|"version",
//	 "conflist": {...},                  // the network configuration list, as a runtime loads it
//	 "pluginDirs": ["/opt/cni/bin"],     // CNI_PATH
//	 "cacheDir": "/var/lib/cni",         // libcni's result cache
//	 "containerID": "...", "netns": "...", "ifName": "eth0",
//	 "args": [["K8S_POD_NAME", "x"]],    // CNI_ARGS
//	 "capabilityArgs": {...},            // runtimeConfig
//	 "validAttachments": [{"containerID": "...", "ifname": "eth0"}],
//	 "pluginType": "dipam"}              // for "version"
//
// For "gc", a missing validAttachments key calls GCNetworkList with no arguments (as cnitool
// does: no cni.dev/valid-attachments is sent), null sends it as null (as CRI-O does for a
// network with no pods), and an array sends that list.
//
// The answer on stdout: {"ok": true, "result": ...} with exit status 0, or {"ok": false,
// "error": {"code": N, "msg": "...", "details": "...", "text": "..."}} with exit status 1,
// where code, msg and details are the plugin's CNI error (code 0 when libcni's error carries
// none) and text is libcni's whole error string.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

type request struct {
	Op               string                 `json:"op"`
	Conflist         json.RawMessage        `json:"conflist"`
	PluginDirs       []string               `json:"pluginDirs"`
	CacheDir         string                 `json:"cacheDir"`
	ContainerID      string                 `json:"containerID"`
	NetNS            string                 `json:"netns"`
	IfName           string                 `json:"ifName"`
	Args             [][2]string            `json:"args"`
	CapabilityArgs   map[string]interface{} `json:"capabilityArgs"`
	ValidAttachments json.RawMessage        `json:"validAttachments"`
	PluginType       string                 `json:"pluginType"`
}

type cniError struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
	Text    string `json:"text"`
}

type answer struct {
	OK     bool        `json:"ok"`
	Result interface{} `json:"result,omitempty"`
	Error  *cniError   `json:"error,omitempty"`
}

func main() {
	result, err := run(os.Stdin)
	out := answer{OK: err == nil, Result: result}
	if err != nil {
		out.Error = &cniError{Text: err.Error()}
		var te *types.Error
		if errors.As(err, &te) {
			out.Error.Code, out.Error.Msg, out.Error.Details = te.Code, te.Msg, te.Details
		} else {
			out.Error.Msg = err.Error()
		}
	}
	enc := json.NewEncoder(os.Stdout)
	if e := enc.Encode(out); e != nil {
		fmt.Fprintln(os.Stderr, "libcni-driver: writing the answer:", e)
		os.Exit(2)
	}
	if err != nil {
		os.Exit(1)
	}
}

func run(in io.Reader) (interface{}, error) {
	var req request
	dec := json.NewDecoder(in)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, fmt.Errorf("libcni-driver: bad request: %w", err)
	}
	cni := libcni.NewCNIConfigWithCacheDir(req.PluginDirs, req.CacheDir, nil)
	ctx := context.Background()
	if req.Op == "version" {
		return cni.GetVersionInfo(ctx, req.PluginType)
	}
	list, err := libcni.NetworkConfFromBytes(req.Conflist)
	if err != nil {
		return nil, err
	}
	rt := &libcni.RuntimeConf{
		ContainerID:    req.ContainerID,
		NetNS:          req.NetNS,
		IfName:         req.IfName,
		Args:           req.Args,
		CapabilityArgs: req.CapabilityArgs,
	}
	switch req.Op {
	case "add":
		res, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return nil, err
		}
		// The result as the runtime holds it: in the list's cniVersion.
		return res, nil
	case "check":
		return nil, cni.CheckNetworkList(ctx, list, rt)
	case "del":
		return nil, cni.DelNetworkList(ctx, list, rt)
	case "status":
		return nil, cni.GetStatusNetworkList(ctx, list)
	case "gc":
		args, err := gcArgs(req.ValidAttachments)
		if err != nil {
			return nil, err
		}
		return nil, cni.GCNetworkList(ctx, list, args)
	case "cached":
		// What libcni cached for this attachment (what a later DEL or CHECK sends as prevResult).
		return cni.GetNetworkListCachedResult(list, rt)
	default:
		return nil, fmt.Errorf("libcni-driver: unknown op %q", req.Op)
	}
}

func gcArgs(raw json.RawMessage) (*libcni.GCArgs, error) {
	if raw == nil {
		return nil, nil
	}
	var valid []types.GCAttachment
	if err := json.Unmarshal(raw, &valid); err != nil {
		return nil, fmt.Errorf("libcni-driver: bad validAttachments: %w", err)
	}
	return &libcni.GCArgs{ValidAttachments: valid}, nil
}
