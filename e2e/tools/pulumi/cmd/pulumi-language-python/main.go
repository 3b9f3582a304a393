// Command pulumi-language-python is the end-to-end tier's stand-in for Pulumi's Python language
// host. The real host is its own Go module (github.com/pulumi/pulumi/sdk/python/cmd/
// pulumi-language-python/v3, untagged) and the Go module proxy our machines reach refuses every
// version of it (403 "This module version is not available", tried by pseudo-version). Everything
// else of `pulumi up` is the real thing: the CLI, the engine, the providers, the Python SDK and the
// SDK's own program launcher (pulumi-language-python-exec, from the sdk/v3 module).
//
// What the CLI needs of a language host to preview, update, refresh and destroy a Python program is
// Handshake, GetPluginInfo, GetRequiredPackages and Run. Each follows the real host
// (sdk/python/cmd/pulumi-language-python/main.go, read at commit 1b5949891b of pulumi/pulumi):
//   - options are parsed the same way (virtualenv, toolchain) and the toolchain is the SDK's own
//     (sdk/v3 python/toolchain): the virtualenv is resolved against the project root, the program
//     runs as `<venv>/bin/python pulumi-language-python-exec --monitor … <entry point>` from the
//     host's working directory, with PULUMI_CONFIG and PULUMI_CONFIG_SECRET_KEYS set;
//   - exit code 32 means the program already told the user what went wrong (Bail);
//   - GetRequiredPackages checks the virtualenv as the real host does but lists no packages: the
//     tier disables plugin acquisition and puts every plugin on PATH, so the list would only name
//     plugins the engine must not download anyway.
// Everything else (pulumi new, about, install, policy packs, debugging) answers Unimplemented.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/version"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"github.com/pulumi/pulumi/sdk/v3/python/toolchain"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// The SDK's program launcher, installed next to this executable (as the real host expects it).
const execScript = "pulumi-language-python-exec"

// The launcher's exit code after it printed an actionable error (main.go
// pythonProcessExitedAfterShowingUserActionableMessage).
const bailExitCode = 32

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer
	exec          string
	engineAddress string
}

func main() {
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.String("tracing", "", "ignored (the real host emits traces)")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Version)
		return
	}
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	h := &host{exec: filepath.Join(filepath.Dir(self), execScript)}
	if _, err := os.Stat(h.exec); err != nil {
		fail(fmt.Errorf("missing executor %s: %w", h.exec, err))
	}
	if flag.NArg() > 0 {
		h.engineAddress = flag.Arg(0)
	}
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, h)
			return nil
		},
	})
	if err != nil {
		fail(err)
	}
	fmt.Printf("%d\n", handle.Port) // the engine reads the port from the first line
	if err := <-handle.Done; err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "pulumi-language-python (e2e stand-in): %v\n", err)
	os.Exit(1)
}

func (h *host) Handshake(
	_ context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	h.engineAddress = req.GetEngineAddress()
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *host) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version.Version}, nil
}

// options is the real host's parseOptions for a program (not a plugin).
func options(info *pulumirpc.ProgramInfo) (toolchain.PythonOptions, error) {
	opts := toolchain.PythonOptions{Root: info.GetRootDirectory(), ProgramDir: info.GetProgramDirectory()}
	raw := info.GetOptions().AsMap()
	if v, ok := raw["virtualenv"]; ok {
		s, ok := v.(string)
		if !ok {
			return opts, errors.New("virtualenv option must be a string")
		}
		opts.Virtualenv = s
	}
	if v, ok := raw["toolchain"]; ok {
		switch v {
		case "pip":
			opts.Toolchain = toolchain.Pip
		case "poetry":
			opts.Toolchain = toolchain.Poetry
		case "uv":
			opts.Toolchain = toolchain.Uv
		default:
			return opts, fmt.Errorf("unsupported toolchain option: %v", v)
		}
	}
	if _, ok := raw["typechecker"]; ok {
		return opts, errors.New("the e2e stand-in language host does not run typecheckers")
	}
	return opts, nil
}

func (h *host) GetRequiredPackages(
	ctx context.Context, req *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	opts, err := options(req.GetInfo())
	if err != nil {
		return nil, err
	}
	tc, err := toolchain.ResolveToolchain(opts)
	if err != nil {
		return nil, err
	}
	if err := tc.ValidateVenv(ctx); err != nil {
		return nil, err
	}
	return &pulumirpc.GetRequiredPackagesResponse{}, nil
}

func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	opts, err := options(req.GetInfo())
	if err != nil {
		return nil, err
	}
	tc, err := toolchain.ResolveToolchain(opts)
	if err != nil {
		return nil, err
	}
	if err := tc.ValidateVenv(ctx); err != nil {
		return nil, err
	}
	args := []string{h.exec}
	add := func(k, v string) {
		if v != "" {
			args = append(args, "--"+k, v)
		}
	}
	add("monitor", req.GetMonitorAddress())
	add("engine", h.engineAddress)
	add("project", req.GetProject())
	add("root_directory", req.GetInfo().GetRootDirectory())
	add("stack", req.GetStack())
	add("pwd", req.GetPwd())
	add("dry_run", strconv.FormatBool(req.GetDryRun()))
	add("parallel", strconv.Itoa(int(req.GetParallel())))
	add("organization", req.GetOrganization())
	args = append(args, req.GetInfo().GetEntryPoint())
	args = append(args, req.GetArgs()...)

	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	if cfg := req.GetConfig(); cfg != nil {
		text, err := json.Marshal(cfg)
		if err != nil {
			return nil, err
		}
		env = append(env, "PULUMI_CONFIG="+string(text))
	}
	keys := req.GetConfigSecretKeys()
	if keys == nil {
		keys = []string{}
	}
	text, err := json.Marshal(keys)
	if err != nil {
		return nil, err
	}
	cmd.Env = append(env, "PULUMI_CONFIG_SECRET_KEYS="+string(text))

	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) {
			return &pulumirpc.RunResponse{
				Error: fmt.Sprintf("problem executing program (could not run language executor): %v", err),
			}, nil
		}
		if status, ok := exitErr.Sys().(syscall.WaitStatus); ok && status.ExitStatus() == bailExitCode {
			return &pulumirpc.RunResponse{Bail: true}, nil
		}
		return &pulumirpc.RunResponse{
			Error: fmt.Sprintf("program exited with non-zero exit code: %d", exitErr.ExitCode()),
		}, nil
	}
	return &pulumirpc.RunResponse{}, nil
}
