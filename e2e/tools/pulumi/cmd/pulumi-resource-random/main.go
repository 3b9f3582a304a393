// Command pulumi-resource-random is the end-to-end tier's stand-in for the pulumi-random provider,
// of which the program uses one resource, RandomPassword (components/*: passwords of the
// registry, the stores and Armada). pulumi-random (github.com/pulumi/pulumi-random/provider/v4)
// bridges terraform-provider-random through pulumi-terraform-bridge/pf, and the Go module proxy our
// machines reach refuses both (403), so the real provider cannot be built here.
//
// It follows terraform-provider-random's random_password (internal/provider/resource_password.go,
// read at v1.3.2-0.20260824155315-e1092b0cfc07): every argument requires replacement (keepers only
// when set), upper/lower/numeric/special default to true and the min_* counts to 0, the id is
// "none", and bcrypt_hash is bcrypt of the result at the default cost. The result is drawn from
// crypto/rand over the enabled character sets; min_* counts and override_special are honoured.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"os"
	"sort"

	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// The pulumi-random release whose Python SDK requirements.txt pins (the version the engine asks for).
const version = "4.21.4"

const passwordType = "random:index/randomPassword:RandomPassword"

const (
	lowerChars   = "abcdefghijklmnopqrstuvwxyz"
	upperChars   = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	numericChars = "0123456789"
	specialChars = "!@#$%&*()-_=+[]{}<>:?"
)

type provider struct {
	pulumirpc.UnimplementedResourceProviderServer
}

func main() {
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterResourceProviderServer(srv, &provider{})
			return nil
		},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-resource-random (e2e stand-in): %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-resource-random (e2e stand-in): %v\n", err)
		os.Exit(1)
	}
}

func (p *provider) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version}, nil
}

func (p *provider) CheckConfig(_ context.Context, req *pulumirpc.CheckRequest) (*pulumirpc.CheckResponse, error) {
	return &pulumirpc.CheckResponse{Inputs: req.GetNews()}, nil
}

func (p *provider) DiffConfig(context.Context, *pulumirpc.DiffRequest) (*pulumirpc.DiffResponse, error) {
	return &pulumirpc.DiffResponse{Changes: pulumirpc.DiffResponse_DIFF_NONE}, nil
}

func (p *provider) Configure(context.Context, *pulumirpc.ConfigureRequest) (*pulumirpc.ConfigureResponse, error) {
	return &pulumirpc.ConfigureResponse{}, nil
}

// defaults are the schema's: booleans true, counts 0 (`number` is the deprecated twin of `numeric`).
var defaults = map[string]any{
	"upper": true, "lower": true, "numeric": true, "number": true, "special": true,
	"minUpper": 0.0, "minLower": 0.0, "minNumeric": 0.0, "minSpecial": 0.0,
}

func checkType(urnType string) error {
	if urnType != passwordType {
		return fmt.Errorf("the e2e stand-in random provider implements only %s, not %s", passwordType, urnType)
	}
	return nil
}

func (p *provider) Check(_ context.Context, req *pulumirpc.CheckRequest) (*pulumirpc.CheckResponse, error) {
	if err := checkType(req.GetType()); err != nil {
		return nil, err
	}
	inputs := req.GetNews().AsMap()
	if _, ok := inputs["length"].(float64); !ok {
		return &pulumirpc.CheckResponse{Failures: []*pulumirpc.CheckFailure{
			{Property: "length", Reason: "missing required property 'length'"}}}, nil
	}
	for key, value := range defaults {
		if _, set := inputs[key]; !set {
			inputs[key] = value
		}
	}
	checked, err := structpb.NewStruct(inputs)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.CheckResponse{Inputs: checked}, nil
}

var arguments = []string{
	"length", "upper", "lower", "numeric", "number", "special", "minUpper", "minLower", "minNumeric",
	"minSpecial", "overrideSpecial", "keepers",
}

func (p *provider) Diff(_ context.Context, req *pulumirpc.DiffRequest) (*pulumirpc.DiffResponse, error) {
	olds, news := req.GetOldInputs().AsMap(), req.GetNews().AsMap()
	if req.GetOldInputs() == nil {
		olds = req.GetOlds().AsMap()
	}
	var replaces []string
	for _, key := range arguments {
		old, oldSet := olds[key]
		value, newSet := news[key]
		if key == "keepers" && !newSet {
			continue // RequiresReplaceIfValuesNotNull
		}
		if oldSet != newSet || fmt.Sprint(old) != fmt.Sprint(value) {
			replaces = append(replaces, key)
		}
	}
	if len(replaces) == 0 {
		return &pulumirpc.DiffResponse{Changes: pulumirpc.DiffResponse_DIFF_NONE}, nil
	}
	sort.Strings(replaces)
	return &pulumirpc.DiffResponse{
		Changes: pulumirpc.DiffResponse_DIFF_SOME, Replaces: replaces, Diffs: replaces,
	}, nil
}

func pick(chars string) (byte, error) {
	n, err := rand.Int(rand.Reader, big.NewInt(int64(len(chars))))
	if err != nil {
		return 0, err
	}
	return chars[n.Int64()], nil
}

func password(inputs map[string]any) (string, error) {
	length := int(inputs["length"].(float64))
	special := specialChars
	if override, ok := inputs["overrideSpecial"].(string); ok && override != "" {
		special = override
	}
	sets := []struct {
		on    string
		min   string
		chars string
	}{
		{"upper", "minUpper", upperChars}, {"lower", "minLower", lowerChars},
		{"numeric", "minNumeric", numericChars}, {"special", "minSpecial", special},
	}
	var result []byte
	all := ""
	for _, set := range sets {
		if on, _ := inputs[set.on].(bool); !on {
			continue
		}
		all += set.chars
		minimum, _ := inputs[set.min].(float64)
		for i := 0; i < int(minimum); i++ {
			c, err := pick(set.chars)
			if err != nil {
				return "", err
			}
			result = append(result, c)
		}
	}
	if all == "" {
		return "", errors.New("at least one of upper, lower, numeric and special must be true")
	}
	for len(result) < length {
		c, err := pick(all)
		if err != nil {
			return "", err
		}
		result = append(result, c)
	}
	for i := len(result) - 1; i > 0; i-- { // shuffle, so the minimums are not all in front
		j, err := rand.Int(rand.Reader, big.NewInt(int64(i+1)))
		if err != nil {
			return "", err
		}
		result[i], result[j.Int64()] = result[j.Int64()], result[i]
	}
	return string(result), nil
}

func (p *provider) Create(_ context.Context, req *pulumirpc.CreateRequest) (*pulumirpc.CreateResponse, error) {
	if err := checkType(req.GetType()); err != nil {
		return nil, err
	}
	outputs := req.GetProperties().AsMap()
	if req.GetPreview() {
		return &pulumirpc.CreateResponse{Properties: req.GetProperties()}, nil
	}
	result, err := password(outputs)
	if err != nil {
		return nil, err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(result), bcrypt.DefaultCost)
	if err != nil {
		return nil, err
	}
	outputs["result"], outputs["bcryptHash"] = result, string(hash)
	properties, err := structpb.NewStruct(outputs)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.CreateResponse{Id: "none", Properties: properties}, nil
}

func (p *provider) Read(_ context.Context, req *pulumirpc.ReadRequest) (*pulumirpc.ReadResponse, error) {
	return &pulumirpc.ReadResponse{Id: req.GetId(), Properties: req.GetProperties(), Inputs: req.GetInputs()}, nil
}

func (p *provider) Update(context.Context, *pulumirpc.UpdateRequest) (*pulumirpc.UpdateResponse, error) {
	return nil, errors.New("random_password has no in-place updates: every change replaces it")
}

func (p *provider) Delete(context.Context, *pulumirpc.DeleteRequest) (*emptypb.Empty, error) {
	return &emptypb.Empty{}, nil
}
